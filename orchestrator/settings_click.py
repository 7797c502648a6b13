"""Click options generated from the declarations of orchestrator/settings_spec.py (kept apart so
that run.toml's settings, declared the same way, do not import click)."""

from __future__ import annotations

from dataclasses import Field, fields
from typing import Any, Callable

import click

from orchestrator.settings_spec import Declared, declarations


def click_type(spec: Declared) -> click.ParamType:
    """The click type that reads a setting as its declaration does."""
    if spec.parse is not None:
        return _Parsed(spec)
    if spec.choices:
        return click.Choice(spec.choices)
    if spec.kind is int:
        return click.IntRange(_bound(spec.low), _bound(spec.high))
    if spec.kind is float:
        return click.FloatRange(spec.low, spec.high)
    return click.STRING


class _Parsed(click.ParamType):
    """A click type that parses with the declaration: its ValueError becomes click's usage error."""

    def __init__(self, spec: Declared) -> None:
        self.spec = spec
        self.name = (spec.metavar or "text").lower()

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):   # a default that is already a value
            return value
        try:
            return self.spec.check(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def click_options(cls: type, *, include_by_launcher: bool) -> list[click.Option]:
    """The click options of a dataclass's declared fields, each named after its field."""
    return [click.Option(decls, **attrs) for decls, attrs in _option_specs(cls, include_by_launcher)]


def click_decorators(cls: type, *, include_by_launcher: bool) -> list[Callable[[Any], Any]]:
    """The same options as `@click.option` decorators, in declaration order."""
    return [click.option(*decls, **attrs) for decls, attrs in _option_specs(cls, include_by_launcher)]


def _option_specs(cls: type, include_by_launcher: bool) -> list[tuple[list[str], dict[str, Any]]]:
    defaults: dict[str, Field[Any]] = {f.name: f for f in fields(cls)}
    specs = []
    for name, spec in declarations(cls).items():
        if spec.by_launcher and not include_by_launcher:
            continue
        default = defaults[name].default
        shown = default is not None and default != ""
        specs.append(([spec.flag, name], {
            "type": click_type(spec), "default": spec.show(default) if shown else default, "show_default": shown,
            "metavar": spec.metavar, "help": spec.full_help + "."}))
    return specs


def _bound(value: float | None) -> int | None:
    return None if value is None else int(value)
