"""One declaration per command-line setting, kept on the dataclass field it fills.

A field declared with `declared(...)` carries a `Declared` in its metadata: the flag, the help, how
text becomes a value (type, bounds, choices or a parser) and back, and the run.toml key whose value
an unset option takes. Click options, argument lists and template checks are all generated from
it (docs/architecture.md, "Settings declared once"; the click options in settings_click.py), so two
entry points cannot disagree on a flag. run.toml's settings are declared the same way, without a flag,
and so are the settings a mapping carries (sandbox limits, the agent's and context's policies, verl's
`hpc_rollout` block): `checked` tests such a mapping against its dataclass's declarations.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Mapping
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
    low_excluded: bool = False                  # the low bound itself is refused: (low, high]
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
        if not self.within(value):
            raise ValueError(f"{text} is outside {self.interval}")
        return value

    def within(self, value: float) -> bool:
        """Whether `value` lies in the bounds (NaN never does)."""
        low = -float("inf") if self.low is None else self.low
        high = float("inf") if self.high is None else self.high
        return (low < value if self.low_excluded else low <= value) and value <= high

    @property
    def interval(self) -> str:
        """The bounds as an interval: "[0, 10]", "(0, 1]", "[1, ...]"."""
        return f"{'(' if self.low_excluded else '['}{_number(self.low)}, {_number(self.high)}]"

    @property
    def range_words(self) -> str:
        """The bounds as people say them: ">= 0", "in (0, 1]", "of any size"."""
        if self.low is not None and self.high is not None:
            return f"in {self.interval}"
        if self.low is not None:
            return f"{'>' if self.low_excluded else '>='} {_number(self.low)}"
        return "of any size" if self.high is None else f"<= {_number(self.high)}"


def declared(default: Any, **spec: Any) -> Any:
    """A dataclass field with its declaration (see Declared for the keywords)."""
    return declared_by(Declared(**spec), default)


def declared_by(spec: Declared, default: Any) -> Any:
    return field(default=default, metadata={SPEC: spec})


def setting(default: Any, help: str, bounds: tuple[float | None, float | None] | None = None,
            choices: tuple[str, ...] = (), kind: type | None = None, low_excluded: bool = False) -> Any:
    """A setting's field: its default, help (the comment above it in run.toml), bounds and choices.

    `kind` is the default's type unless given (a setting whose default is None: unset). An enum's
    kind takes its values as choices; `object` is a value `checked` passes on for its owner to read.
    A bound of None leaves that side open; `low_excluded` refuses the low bound itself."""
    low, high = bounds if bounds is not None else (None, None)
    kind = kind or type(default)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        choices = choices or tuple(member.value for member in kind)
    return declared_by(Declared(help=help, kind=kind, low=low, high=high, low_excluded=low_excluded, choices=choices),
                       default)


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


class Numbers(enum.Enum):
    """What a family's numbers accept: each family keeps what it always took, so no row that ran is refused."""

    EXACT = "exact"         # int or float (a whole number: int only); never a bool
    TRUNCATE = "truncate"   # int or float, never a bool; a whole number keeps int(value)
    TEXT = "text"           # whatever float() reads, text too; a whole number keeps int(value)
    WHOLE = "whole"         # int or float, never a bool; a whole number's without a fraction (4.0: 4)


@dataclass(frozen=True)
class Family:
    """How one family of settings is named in its errors: `label` names a key as its user writes it."""

    noun: str                               # "context setting": unknown context setting 'keep'; valid: ...
    label: str = "{key}"                    # "context {key}", "hpc_rollout.{key}"
    error: type[Exception] = ValueError
    numbers: Numbers = Numbers.EXACT
    # {interval}: "[0, 10]" or "(0, 1]"; {range}: "in [0, 10]", ">= 0"; {low}, {high}: the bounds alone
    out_of_range: str = "{name}={value!r} must be {kind} in {interval}{about}"
    not_a_number: str = ""                  # "": worded as out_of_range
    not_a_choice: str = "{name} {value!r}: choose one of {choices}"
    show_help: bool = False                 # the declaration's help, in parentheses after the range
    none_is_unset: bool = True              # None for a setting whose default is None leaves it unset
    scope: str = ""                         # said before an unknown key: "classes.long: unknown key 'x'"

    def fail(self, template: str, key: str, value: Any, spec: Declared) -> Exception:
        return self.error(template.format(
            name=self.label.format(key=key), value=value, kind="a whole number" if spec.kind is int else "a number",
            low=_number(spec.low), high=_number(spec.high), interval=spec.interval, range=spec.range_words,
            choices=", ".join(spec.choices), about=f" ({spec.help})" if self.show_help else ""))


def checked(cls: type, values: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """`values` checked against `cls`'s declared fields: each value as its field holds it, or
    `family.error` naming the key, the value and what it may be (an unknown key: the valid ones)."""
    specs = declarations(cls)
    unknown = [key for key in values if key not in specs]
    if unknown:
        prefix = family.label.format(key="")
        dotted = prefix.endswith(".") and not family.scope
        named = (lambda key: f"{prefix}{key}") if dotted else repr   # a dotted path, or a quoted key
        close = difflib.get_close_matches(str(unknown[0]), specs, n=1)
        raise family.error(f"{family.scope + ': ' if family.scope else ''}unknown {family.noun}{'s' if len(unknown) > 1 else ''} {', '.join(map(named, unknown))}; "
                           f"valid: {', '.join(specs)}" + (f" (did you mean {named(close[0])}?)" if close else ""))
    unset = {f.name for f in fields(cls) if f.default is None and family.none_is_unset}   # None: it stays unset
    return {key: None if value is None and key in unset else _checked_value(key, value, specs[key], family)
            for key, value in values.items()}


def _checked_value(key: str, value: Any, spec: Declared, family: Family) -> Any:
    if spec.kind is object:
        return value
    if spec.kind is bool:
        if not isinstance(value, bool):
            raise family.error(f"{family.label.format(key=key)} must be true or false, got {value!r}")
        return value
    if spec.choices:
        if isinstance(value, bool) or value not in spec.choices:
            raise family.fail(family.not_a_choice, key, value, spec)
        return spec.kind(value)
    if spec.kind in (int, float):
        number = _as_number(value, spec.kind, family.numbers)
        if number is None:
            raise family.fail(family.not_a_number or family.out_of_range, key, value, spec)
        if not spec.within(number):   # NaN too
            raise family.fail(family.out_of_range, key, value, spec)
        return spec.kind(number)
    if not isinstance(value, spec.kind):
        raise family.error(f"{family.label.format(key=key)} must be {spec.kind.__name__}, got {value!r}")
    return value


def _as_number(value: Any, kind: type, numbers: Numbers) -> float | None:
    """`value` as a number under `numbers`' rule, or None when it is not one."""
    if numbers is Numbers.TEXT:
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if numbers is Numbers.EXACT and kind is int and not isinstance(value, int):
        return None
    if numbers is Numbers.WHOLE and kind is int and not float(value).is_integer():
        return None
    return value


def _number(value: float | None) -> str:
    if value is None:
        return "..."
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
