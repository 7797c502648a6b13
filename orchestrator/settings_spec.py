"""One declaration per command-line setting, kept on the dataclass field it fills.

A field declared with `declared(...)` carries a `Declared` in its metadata: the flag, the help, how
text becomes a value (type, bounds, choices or a parser) and back, and the run.toml key whose value
an unset option takes. Click options, argument lists and template checks are all generated from
it (docs/architecture.md, "Settings declared once"), so two entry points cannot disagree on a flag.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields
from typing import Any, Callable

import click

SPEC = "hpc_rollout.declared"   # the metadata key of a declared field


@dataclass(frozen=True)
class Declared:
    flag: str                                   # "--init-pool"
    help: str
    kind: type = str                            # int, float or str; `parse` overrides it
    low: float | None = None                    # bounds (inclusive); None: unbounded on that side
    high: float | None = None
    choices: tuple[str, ...] = ()
    parse: Callable[[str], Any] | None = None   # text -> value; ValueError naming what is valid
    show: Callable[[Any], str] = str            # value -> text that `parse` reads back
    run_toml: str = ""                          # unset (None): this run.toml setting's value
    by_launcher: bool = False                   # set by the launcher itself, never by a user's flag
    metavar: str | None = None

    @property
    def full_help(self) -> str:
        """The help with where an unset value comes from."""
        if not self.run_toml:
            return self.help
        section, _, key = self.run_toml.partition(".")
        return f"{self.help}; unset: run.toml [{section}] {key}"

    def check(self, text: str) -> Any:
        """The value of `text`, or ValueError saying what this setting accepts."""
        if self.parse is not None:
            return self.parse(text)
        if self.choices and text not in self.choices:
            raise ValueError(f"{text!r} is not one of {', '.join(self.choices)}")
        if self.kind is str:
            return text
        try:
            value = self.kind(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {'a whole number' if self.kind is int else 'a number'}") from None
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise ValueError(f"{text} is outside [{_number(self.low)}, {_number(self.high)}]")
        return value

    def click_type(self) -> click.ParamType:
        if self.parse is not None:
            return _Parsed(self)
        if self.choices:
            return click.Choice(self.choices)
        if self.kind is int:
            return click.IntRange(_bound(self.low), _bound(self.high))
        if self.kind is float:
            return click.FloatRange(self.low, self.high)
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


def declared(default: Any, **spec: Any) -> Any:
    """A dataclass field with its declaration (see Declared for the keywords)."""
    return field(default=default, metadata={SPEC: Declared(**spec)})


def declarations(cls: type) -> dict[str, Declared]:
    """The declared fields of a dataclass by field name, in declaration order."""
    return {f.name: f.metadata[SPEC] for f in fields(cls) if SPEC in f.metadata}


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
            "type": spec.click_type(), "default": spec.show(default) if shown else default, "show_default": shown,
            "metavar": spec.metavar, "help": spec.full_help + "."}))
    return specs


def to_args(instance: Any) -> list[str]:
    """The command-line arguments that give back `instance`'s declared values (unset ones left out)."""
    args = []
    for name, spec in declarations(type(instance)).items():
        value = getattr(instance, name)
        if value is not None and value != "":
            args += [spec.flag, spec.show(value)]
    return args


def _bound(value: float | None) -> int | None:
    return None if value is None else int(value)


def _number(value: float | None) -> str:
    if value is None:
        return "..."
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
