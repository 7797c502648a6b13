"""One declaration per command-line setting, kept on the dataclass field it fills.

A field declared with `declared(...)` carries a `Declared` in its metadata: the flag, the help, how
text becomes a value (type, bounds, choices or a parser) and back, and the run.toml key whose value
an unset option takes. Click options, argument lists and template checks are all generated from
it (docs/architecture.md, "Settings declared once"; the click options in settings_click.py), so two
entry points cannot disagree on a flag. run.toml's settings are declared the same way, without a flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

SPEC = "hpc_rollout.declared"   # the metadata key of a declared field


@dataclass(frozen=True)
class Declared:
    help: str
    flag: str = ""                              # "--init-pool"; "": run.toml only
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
        low = -float("inf") if self.low is None else self.low
        high = float("inf") if self.high is None else self.high
        if not low <= value <= high:   # NaN too
            raise ValueError(f"{text} is outside [{_number(self.low)}, {_number(self.high)}]")
        return value


def declared(default: Any, **spec: Any) -> Any:
    """A dataclass field with its declaration (see Declared for the keywords)."""
    return declared_by(Declared(**spec), default)


def declared_by(spec: Declared, default: Any) -> Any:
    return field(default=default, metadata={SPEC: spec})


def setting(default: Any, help: str, bounds: tuple[float, float] | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A run.toml setting's field: its default, help (the comment above it in run.toml), bounds and choices."""
    low, high = bounds if bounds is not None else (None, None)
    return declared_by(Declared(help=help, kind=type(default), low=low, high=high, choices=choices), default)


def declarations(cls: type) -> dict[str, Declared]:
    """The declared fields of a dataclass by field name, in declaration order."""
    return {f.name: f.metadata[SPEC] for f in fields(cls) if SPEC in f.metadata}


def to_args(instance: Any) -> list[str]:
    """The command-line arguments that give back `instance`'s declared values (unset ones left out)."""
    args = []
    for name, spec in declarations(type(instance)).items():
        value = getattr(instance, name)
        if value is not None and value != "":
            args += [spec.flag, spec.show(value)]
    return args


def _number(value: float | None) -> str:
    if value is None:
        return "..."
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
