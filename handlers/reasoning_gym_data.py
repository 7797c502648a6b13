"""reasoning-gym's datasets as task rows: which names exist, which options a row may give, the
dataset and entry a row names, and `reasoning_gym_rows` (the rows of one dataset, ready to submit).

A row names an entry, never holds one: {"dataset": "leg_counting", "seed": 1, "size": 100,
"index": 7, "options": {...}}, the options being the keyword arguments of reasoning-gym's
`create_dataset` (its YAML convention: plain JSON values). reasoning-gym is an optional extra;
every function here imports it on first use and says how to install it when it is missing.
"""

from __future__ import annotations

import difflib
import functools
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from types import ModuleType
from typing import Any

from orchestrator.errors import HpcRolloutError

MISSING = ("the reasoning_gym handler needs the reasoning-gym package: pip install 'hpc-rollout[reasoning-gym]' "
           "(or pip install 'reasoning-gym>=0.1.25,<0.2')")
LIST_HINT = "`hpc-rollout tasks reasoning-gym --list` lists all"
# reasoning-gym's composite config takes whole dataset specs; a row names one dataset, and a mix
# is a file of rows of several (the row source writes each).
REFUSED = {"composite": "a row names one dataset; for a mix, write rows of each dataset into one file"}
ROW_KEYS = ("seed", "size")   # the row's own keys, never options


class ReasoningGymMissing(HpcRolloutError, ImportError):
    """reasoning-gym is not installed (the same for every row: said once, with the install command)."""


def library() -> ModuleType:
    """The reasoning_gym package, imported here (seconds: it imports sympy and matplotlib)."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ReasoningGymMissing(f"{MISSING}: {exc}") from None
    return reasoning_gym


def registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registered datasets: name -> (dataset class, config class)."""
    library()
    from reasoning_gym.factory import DATASETS

    return dict(DATASETS)


def dataset_names() -> list[str]:
    """The names a row may give, sorted."""
    return sorted(name for name in registry() if name not in REFUSED)


@dataclass(frozen=True)
class EntrySpec:
    """The entry a row names: reasoning-gym's `create_dataset(dataset, seed=, size=, **options)[index]`."""

    dataset: str
    seed: int
    size: int
    index: int
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, instance: Mapping[str, Any]) -> EntrySpec:
        """The row's spec, its keys' types checked (ValueError naming the key)."""
        name = instance.get("dataset")
        if not isinstance(name, str) or not name:
            raise ValueError("a reasoning_gym row needs 'dataset': the name of one of reasoning-gym's datasets")
        seed, size, index = (_integer(instance, key) for key in ("seed", "size", "index"))
        options = instance.get("options", {})
        if not isinstance(options, Mapping):
            raise ValueError(f"reasoning_gym 'options' must be an object of {name}'s options, got {options!r}")
        return cls(name, seed, size, index, dict(options))

    def key(self) -> str:
        """One text per distinct dataset (the options in a canonical order), for the cache."""
        return json.dumps([self.dataset, self.seed, self.size, self.options], sort_keys=True)


def _integer(instance: Mapping[str, Any], key: str) -> int:
    value = instance.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"a reasoning_gym row needs '{key}': an integer, got {value!r}")
    return value


def check_name(name: str) -> None:
    """ValueError for a name that is no usable dataset, with the close matches and how to list all."""
    if name in REFUSED:
        raise ValueError(f"reasoning-gym's {name!r} cannot be a row's dataset: {REFUSED[name]}")
    names = dataset_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        hint = f" (close matches: {', '.join(repr(c) for c in close)})" if close else ""
        raise ValueError(f"unknown reasoning-gym dataset {name!r}{hint}; {LIST_HINT} {len(names)}")


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse options a row may not choose: the row's own seed and size, and any file of the worker."""
    for key in ROW_KEYS:
        if key in options:
            raise ValueError(f"reasoning_gym options may not set {key!r}: it is the row's own '{key}' key")
    for path, value in _strings(options, "options"):
        # spell_backward's data_file is joined to reasoning-gym's data folder: '../..' or an absolute
        # path would read any file of the worker into the prompt. The folder's own names need no '/'.
        if _names_a_file(value):
            raise ValueError(f"reasoning_gym {path} = {value!r} names a file: a row is data, the worker's files "
                             f"are the operator's (give a name without a path, e.g. one of reasoning-gym's own)")


def _names_a_file(value: str) -> bool:
    if len(value) <= 1:
        return False   # an operator such as '/' (basic_arithmetic's operators) is no path
    return "/" in value or "\\" in value or value.startswith(("~", ".."))


def _strings(value: Any, where: str) -> list[tuple[str, str]]:
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, Mapping):
        return [found for key, item in value.items() for found in _strings(item, f"{where}.{key}")]
    if isinstance(value, (list, tuple)):
        return [found for number, item in enumerate(value) for found in _strings(item, f"{where}[{number}]")]
    return []


_lock = threading.Lock()   # INIT builds in threads: one build per distinct dataset


def dataset(spec: EntrySpec) -> Any:
    """The dataset `spec` names, built once per process (ValueError with reasoning-gym's own words)."""
    library()   # first: a missing package is said as such, whatever is cached
    check_name(spec.dataset)
    check_options(spec.dataset, spec.options)
    with _lock:
        return _built(spec.key())


@functools.lru_cache(maxsize=64)
def _built(key: str) -> Any:
    name, seed, size, options = json.loads(key)
    try:
        return library().create_dataset(name, seed=seed, size=size, **options)
    except Exception as exc:   # its config's assertions, TypeErrors and ValueErrors: its words
        text = str(exc) or type(exc).__name__
        if isinstance(exc, TypeError) and "unexpected keyword argument" in text:
            text += f"; {name} takes: {', '.join(option_names(name))}"
        raise ValueError(f"reasoning-gym rejects {name} options {options}: {text}") from None


def option_names(name: str) -> list[str]:
    """The options of dataset `name` (its config's fields, less the row's own seed and size)."""
    config = registry()[name][1]
    return [f.name for f in fields(config) if f.name not in ROW_KEYS] if is_dataclass(config) else []


def check_spec(spec: EntrySpec) -> None:
    """What submit checks: the dataset builds with these options and holds the index."""
    dataset(spec)
    if not 0 <= spec.index < spec.size:
        raise ValueError(f"reasoning_gym index {spec.index} is outside the dataset (size {spec.size}: 0 to "
                         f"{spec.size - 1})")


def entry(spec: EntrySpec) -> dict[str, Any]:
    """The entry {question, answer, metadata} the row names (generated: milliseconds to seconds)."""
    check_spec(spec)
    return dict(dataset(spec)[spec.index])


def scored_in_process(name: str) -> bool:
    """Whether the dataset keeps reasoning-gym's default scorer, which only compares strings (equal,
    or the answer holds the truth: partial credit). Every other scorer is code nobody here has read
    for this version (several hand the answer to eval() or sympy's parse_expr): a scorer sandbox."""
    from reasoning_gym.dataset import ProceduralDataset

    return bool(getattr(registry()[name][0], "score_answer", None) is ProceduralDataset.score_answer)


def dataset_module(name: str) -> str:
    """The module that defines dataset `name` (what the scorer sandbox imports)."""
    return str(registry()[name][0].__module__)


def reasoning_gym_rows(name: str, size: int, seed: int, **options: Any) -> list[dict[str, Any]]:
    """One row per entry of the dataset (index 0 to size - 1), checked as submit checks them.

        rows = reasoning_gym_rows("leg_counting", size=100, seed=1, max_animals=5)
    """
    if size < 1:
        raise ValueError(f"reasoning_gym rows need a size of at least 1, got {size}")
    check_spec(EntrySpec(name, seed, size, 0, dict(options)))
    extra = {"options": dict(options)} if options else {}
    return [{"instance_id": f"{name}-s{seed}-{index}", "dataset": name, "seed": seed, "size": size, "index": index,
             **extra} for index in range(size)]
