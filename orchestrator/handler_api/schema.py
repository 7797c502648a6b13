"""Instance schemas: the keys a handler's task instances take, each with its JSON type, whether it is
required, its default and what it means, declared once next to the handler.

`submit` checks every row against its handler's schema before the handler's own
`validate_instance` (which keeps the checks a key list cannot say: "a problem or a verl prompt",
ranges, parsers...): an unknown key is refused with the key it probably meant,

    tasks.jsonl:3: unknown key 'run_s' (did you mean 'run'?); sleep takes: init, run, eval, ...

and `hpc-rollout handlers NAME` lists the fields. A handler without a schema (`instance_schema =
None`, any third-party handler written before this existed) is not checked here, and
`hpc-rollout handlers` says so. The schema says what a key is, not whether the operator allows it
(images, network and binds are the sandbox policy's, checked against run.toml).

Hand-written rather than pydantic or msgspec: neither is a dependency of the project, their
errors do not name the key that was meant, and what is needed is small (key names, shallow JSON
types, nested objects, defaults and descriptions for a listing); the deep checks live in the
handlers and stay there.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import HpcRolloutError

# A verl row (data_source, prompt, ability, reward_model, extra_info) submitted as it is: these
# keys are part of every such row, whatever the handler reads of them; verl's RLHFDataset also
# lifts extra_info's tools_kwargs and interaction_kwargs to the top of each row it yields.
VERL_ROW_KEYS = ("data_source", "prompt", "ability", "reward_model", "extra_info", "tools_kwargs",
                 "interaction_kwargs")
# Keys `submit` itself reads from any instance (the row's instance_id column).
SUBMIT_KEYS = ("instance_id",)


class Kind(str, enum.Enum):
    """JSON value kinds, as a task file can hold them."""

    STRING = "string"
    NUMBER = "number"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    OBJECT = "object"
    LIST = "list"
    NULL = "null"
    ANY = "any"

    def matches(self, value: Any) -> bool:
        if self is Kind.ANY:
            return True
        if self is Kind.NULL:
            return value is None
        if isinstance(value, bool):
            return self is Kind.BOOLEAN   # true is not 1 here
        return isinstance(value, _PYTHON_TYPES[self])


_PYTHON_TYPES: dict[Kind, type | tuple[type, ...]] = {
    Kind.STRING: str, Kind.NUMBER: (int, float), Kind.INTEGER: int, Kind.BOOLEAN: bool, Kind.OBJECT: dict,
    Kind.LIST: (list, tuple),
}


@dataclass(frozen=True)
class Key:
    """One key of an instance: its kinds (any of them), requirement, default and meaning."""

    name: str
    kinds: tuple[Kind, ...]
    description: str
    required: bool = False
    default: Any = None                      # what the handler uses when the key is absent (None: nothing)
    keys: "InstanceSchema | None" = None     # an object whose own keys are known
    # The kinds as Python types, for a check of a handful of instructions per value.
    _types: tuple[type, ...] = field(init=False, repr=False, compare=False)
    _takes: frozenset[Kind] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        types: list[type] = []
        for kind in self.kinds:
            found = _PYTHON_TYPES.get(kind, ())
            types += list(found) if isinstance(found, tuple) else [found]
        object.__setattr__(self, "_types", tuple(types))
        object.__setattr__(self, "_takes", frozenset(self.kinds))

    def accepts(self, value: Any) -> bool:
        if Kind.ANY in self._takes:
            return True
        if value is None:
            return Kind.NULL in self._takes
        if isinstance(value, bool):
            return Kind.BOOLEAN in self._takes   # true is not 1 here
        return isinstance(value, self._types)

    def type_text(self) -> str:
        return " or ".join(kind.value for kind in self.kinds)


def instance_key(name: str, kinds: Kind | tuple[Kind, ...], description: str, *, required: bool = False,
                 default: Any = None, keys: "InstanceSchema | None" = None) -> Key:
    """Shorthand: `instance_key("run", (Kind.NUMBER, Kind.OBJECT), "seconds of RUN", default=0)`."""
    return Key(name, kinds if isinstance(kinds, tuple) else (kinds,), description, required, default, keys)


@dataclass(frozen=True)
class InstanceSchema:
    keys: tuple[Key, ...]
    open: bool = False          # other keys are allowed (kept, unused): a map of free names
    accepts_verl_rows: bool = False
    by_name: dict[str, Key] = field(init=False, repr=False, compare=False)
    # The keys accepted at the top of an instance, without and with a verl row's own (built once:
    # submit checks every row of files of 100,000 rows).
    _top: dict[str, Key] = field(init=False, repr=False, compare=False)
    _top_verl: dict[str, Key] = field(init=False, repr=False, compare=False)
    _required: tuple[Key, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {k.name: k for k in self.keys}
        top = dict(by_name)
        for name in SUBMIT_KEYS:
            top.setdefault(name, Key(name, (Kind.STRING, Kind.INTEGER), "the task's own id (the row's instance_id)"))
        top_verl = dict(top)
        for name in VERL_ROW_KEYS if self.accepts_verl_rows else ():
            top_verl.setdefault(name, Key(name, (Kind.ANY,), "a verl row's own key"))
        object.__setattr__(self, "by_name", by_name)
        object.__setattr__(self, "_top", top)
        object.__setattr__(self, "_top_verl", top_verl)
        object.__setattr__(self, "_required", tuple(k for k in self.keys if k.required))

    def default(self, name: str) -> Any:
        return self.by_name[name].default

    def value(self, instance: Mapping[str, Any], name: str) -> Any:
        """The instance's value of `name`, or the schema's default."""
        return instance.get(name, self.by_name[name].default)

    def merged(self, *others: "InstanceSchema | Iterable[Key]") -> "InstanceSchema":
        """These keys plus others' (the first declaration of a name wins)."""
        keys = {k.name: k for k in self.keys}
        for other in others:
            for extra in (other.keys if isinstance(other, InstanceSchema) else other):
                keys.setdefault(extra.name, extra)
        return InstanceSchema(tuple(keys.values()), self.open, self.accepts_verl_rows)

    def problems(self, instance: Mapping[str, Any], handler: str = "", prefix: str = "") -> list[str]:
        """What is wrong with `instance`'s keys and value types, each as one sentence (empty: fine)."""
        if prefix:
            known = self.by_name
        else:
            known = self._top_verl if "data_source" in instance else self._top
        found: list[str] = []
        for name, value in instance.items():
            spec = known.get(name)
            if spec is None:
                # Parquet (and verl's batch) has every column in every row: a null in a column this
                # handler does not take stands for "absent". A value in it is refused.
                if not self.open and value is not None:
                    found.append(self._unknown(prefix + name, name, known, handler))
                continue
            if not spec.accepts(value):
                found.append(f"key '{prefix}{name}' must be {spec.type_text()}, got {_json_kind(value)} {_short(value)}")
            elif spec.keys is not None and isinstance(value, dict):
                found += spec.keys.problems(value, handler, prefix=f"{prefix}{name}.")
        for spec in self._required:
            if spec.name not in instance:
                inner = [f"{prefix}{spec.name}.{k.name}" for k in spec.keys.keys if k.required] if spec.keys else []
                holding = f" with {', '.join(inner)}" if inner else ""
                found.append(f"missing key '{prefix}{spec.name}' ({spec.type_text()}{holding}): {spec.description}")
        return found

    def _unknown(self, shown: str, name: str, known: Mapping[str, Key], handler: str) -> str:
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        whose = f"{handler} takes" if handler else "valid keys"
        if close:
            return f"unknown key '{shown}' (did you mean '{shown[:len(shown) - len(name)]}{close[0]}'?)"
        return f"unknown key '{shown}'; {whose}: {', '.join(known) or 'none'}"

    def check(self, instance: Mapping[str, Any], handler: str = "") -> None:
        """Raise InstanceSchemaError with every problem, or return."""
        found = self.problems(instance, handler)
        if found:
            raise InstanceSchemaError("; ".join(found))

    def rows(self, prefix: str = "") -> list[tuple[str, str, str, str]]:
        """(key, type, required or default, description) per key, nested keys after their object."""
        listed: list[tuple[str, str, str, str]] = []
        for spec in self.keys:
            need = "required" if spec.required else ("" if spec.default is None else f"default {_short(spec.default)}")
            listed.append((prefix + spec.name, spec.type_text(), need, spec.description))
            if spec.keys is not None:
                listed += spec.keys.rows(prefix=f"{prefix}{spec.name}.")
        return listed


class InstanceSchemaError(HpcRolloutError, ValueError):
    """An instance holds a key its handler does not take, or a value of the wrong type."""


def _json_kind(value: Any) -> str:
    for kind in (Kind.NULL, Kind.BOOLEAN, Kind.INTEGER, Kind.NUMBER, Kind.STRING, Kind.LIST, Kind.OBJECT):
        if kind.matches(value):
            return kind.value
    return type(value).__name__


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
