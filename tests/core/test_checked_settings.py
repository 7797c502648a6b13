"""Settings that arrive as a mapping (sandbox limits and options, the agent's limits, the context
policy, the harness handler's settings, a submission's sampling parameters, a resource class's
figures, verl's hpc_rollout block and what the manager reads of verl's rollout section) are
declared on their dataclass's fields with `setting(...)` and checked by one helper,
`settings_spec.checked`: every family refuses a value beyond a declared bound and an unknown key,
naming the key, the value and what is valid.
And no module writes its own table of bounds beside its dataclass (issue 38, item 1).

In-process and static (the convention test reads sources with ast).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from hpc_rollout.handlers.harness_task import HarnessSettings
from orchestrator.agent.context import ContextPolicy
from orchestrator.agent.loop import AgentLimits
from orchestrator.resource_class import ResourceClass, parse_class
from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.sandbox.limits import Limits
from orchestrator.sandbox.options import SandboxOptions, SandboxRequest
from orchestrator.settings_spec import Declared, Family, checked, declarations, setting
from orchestrator.submission.sampling import RangedSampling, sampling_problem
from orchestrator.trainer.verl.settings import Block, RolloutShape, Sampling, VerlConfigError, parse_settings

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("orchestrator", "handlers")

# family: (its dataclass, how its owner parses a mapping of it, the error that refuses one)
FAMILIES: dict[str, tuple[type, Callable[[dict[str, Any]], Any], type[Exception]]] = {
    "sandbox limits": (Limits, Limits.parse, SandboxConfigError),
    "sandbox options": (SandboxRequest, lambda values: SandboxOptions.parse(**values), SandboxConfigError),
    "agent limits": (AgentLimits, lambda values: AgentLimits.parse(AgentLimits(), values), ValueError),
    "context policy": (ContextPolicy, lambda values: ContextPolicy.parse(ContextPolicy(), values), ValueError),
    "verl hpc_rollout block": (Block, lambda values: parse_settings(verl_config(block=values)), VerlConfigError),
    "harness settings": (HarnessSettings, lambda values: HarnessSettings.parse(harness_row(values)), ValueError),
    "submission sampling": (RangedSampling, lambda values: refuse(sampling_problem(values)), ValueError),
    "resource class": (ResourceClass, lambda values: parse_class("long", values), ValueError),
}
# Fields that name a thing rather than set it: a resource class's name is its table's, [classes.NAME].
NOT_SETTINGS = {ResourceClass: {"name"}}
# verl's own sections, of which the manager reads (and bounds) a few keys and leaves the rest to verl.
SECTIONS: dict[str, tuple[type, Callable[[dict[str, Any]], Any], type[Exception]]] = {
    "verl rollout shape": (RolloutShape, lambda values: parse_settings(verl_config(rollout=values)), VerlConfigError),
    "verl sampling": (Sampling, lambda values: parse_settings(verl_config(rollout=values)), VerlConfigError),
}


def verl_config(block: dict[str, Any] | None = None, rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"actor_rollout_ref": {"rollout": {"n": 2, **(rollout or {})}, "model": {"path": "/models/tiny"}},
            "hpc_rollout": {"spool": "/scratch/run1", **(block or {})}}


def harness_row(settings: dict[str, Any]) -> dict[str, Any]:
    return {"problem": "1 + 1?", "answer": "2", "harness": {"command": "true", **settings}}


def refuse(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)


def beyond(spec: Declared) -> Any:
    """A value of the setting's kind past one of its bounds."""
    value = spec.high * 2 + 1 if spec.high is not None else (spec.low or 0) - 1
    return spec.kind(value)


def shown(bound: float | None) -> str:
    return "..." if bound is None else f"{bound:.12g}"


@pytest.mark.parametrize("family", [*FAMILIES, *SECTIONS])
def test_every_family_declares_each_field_and_refuses_a_value_beyond_its_bounds_and_an_unknown_key(family: str) -> None:
    cls, parse, error = FAMILIES.get(family) or SECTIONS[family]
    declared = declarations(cls)
    assert set(declared) == {f.name for f in fields(cls)} - NOT_SETTINGS.get(cls, set())
    bounded = {key: spec for key, spec in declared.items() if spec.low is not None or spec.high is not None}
    assert bounded, f"{family} declares no bounds"
    for key, spec in bounded.items():
        value = beyond(spec)
        with pytest.raises(error) as refused:
            parse({key: value})
        message = str(refused.value)
        named = f"{key}={value!r}" in message.replace(" = ", "=")   # "max_turns=0", "classes.long.cpus = 8193"
        assert named or (key in message and f"got {value!r}" in message), message
        assert f"[{shown(spec.low)}, {shown(spec.high)}]" in message or spec.range_words in message, message
    if family in SECTIONS:
        assert parse({"no_such_key": 1}) is not None   # verl's key, not ours
        return
    with pytest.raises(error, match=r"unknown .*no_such_key'?[;:] .*valid: .*" + next(iter(declared))):
        parse({"no_such_key": 1})


def test_the_helper_names_the_key_the_value_and_the_range_and_keeps_each_familys_numbers() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Knobs:
        turns: int = setting(4, "turns kept", bounds=(0, 10))
        scale: float = setting(1.0, "a scale", bounds=(0, 2))
        fast: bool = setting(False, "go fast")
        lag: int | None = setting(None, "lag", bounds=(-1, 5), kind=int)

    family = Family("knob", "knob {key}", show_help=True)
    assert checked(Knobs, {"turns": 3, "scale": 2, "fast": True, "lag": None}, family) == \
        {"turns": 3, "scale": 2.0, "fast": True, "lag": None}
    for values, message in (({"turns": 11}, r"knob turns=11 must be a whole number in \[0, 10\] \(turns kept\)"),
                            ({"turns": 2.5}, "whole number"), ({"turns": True}, "whole number"),
                            ({"scale": float("nan")}, r"scale=nan must be a number in \[0, 2\]"),
                            ({"fast": "yes"}, "knob fast must be true or false, got 'yes'"),
                            ({"turn": 1}, r"unknown knob 'turn'; valid: turns, scale, fast, lag \(did you mean 'turns'\?\)")):
        with pytest.raises(ValueError, match=message):
            checked(Knobs, values, family)


def test_an_open_bound_an_excluded_low_and_a_none_that_is_not_unset_are_worded_as_people_read_them() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Dial:
        share: float = setting(1.0, "a share", bounds=(0, 1), low_excluded=True)
        count: int = setting(1, "a count", bounds=(1, None))
        seed: int | None = setting(None, "a seed", kind=int)

    family = Family("dial", none_is_unset=False, out_of_range="{name}={value!r}: {range}",
                    not_a_number="{name}={value!r} is not {kind}: give one {range}")
    assert checked(Dial, {"share": 1, "count": 10**9, "seed": -5}, family) == {"share": 1.0, "count": 10**9, "seed": -5}
    for values, message in (({"share": 0}, r"share=0: in \(0, 1\]"), ({"count": 0}, "count=0: >= 1"),
                            ({"seed": None}, "seed=None is not a whole number: give one of any size"),
                            ({"seed": 1.5}, "seed=1.5 is not a whole number")):
        with pytest.raises(ValueError, match=message):
            checked(Dial, values, family)


# A hand-written table of bounds: a dict literal of names to tuples that start with numbers, or a
# dict literal named like one (BOUNDS, _BOUNDS, CLASS_BOUNDS, RANGES). A table derived from the
# declarations (a comprehension, as config.py's BOUNDS) is not one.
TABLE_NAMES = ("BOUNDS", "RANGES")
# Tables left, each with why (none now). A new one: declare its fields with `setting(...)` and check
# them with `checked` instead; the test fails until you do.
KNOWN_TABLES: dict[str, str] = {}


def _numeric(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) and _numeric(node.right)
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


def _is_bounds_table(name: str, value: ast.expr | None) -> bool:
    if not isinstance(value, ast.Dict) or not value.values:
        return False
    if any(name.upper().endswith(word) for word in TABLE_NAMES):
        return True
    return all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.keys) and all(
        isinstance(v, ast.Tuple) and len(v.elts) >= 2 and _numeric(v.elts[0]) and _numeric(v.elts[1])
        for v in value.values)


def bounds_tables(source: str, path: str) -> Iterator[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and _is_bounds_table(target.id, value):
                yield f"{path}:{target.id}"


def test_no_module_but_settings_spec_writes_its_own_table_of_bounds() -> None:
    found = {table for root in ROOTS for file in sorted((REPO / root).rglob("*.py"))
             if file.name != "settings_spec.py"
             for table in bounds_tables(file.read_text(), str(file.relative_to(REPO)))}
    assert found - set(KNOWN_TABLES) == set(), (
        "declare these settings on their dataclass with settings_spec.setting(..., bounds=...) and check them "
        "with settings_spec.checked instead of a table beside it")
    assert set(KNOWN_TABLES) - found == set(), "a table is gone: remove its line from KNOWN_TABLES"


def test_the_convention_check_finds_each_way_a_table_is_written() -> None:
    caught = list(bounds_tables('BOUNDS = {"a": (0, 1)}\nclass P:\n    RANGES: dict = {"b": 1}\n'
                                'LIMITS = {"c": (1, 1 << 20, "MiB")}\n', "m.py"))
    assert sorted(caught) == ["m.py:BOUNDS", "m.py:LIMITS", "m.py:RANGES"]
    assert list(bounds_tables('BOUNDS = {k: (s.low, s.high) for k, s in SPECS.items()}\nNAMES = {"a": "b"}\n',
                              "m.py")) == []


def test_the_instance_keys_of_a_declared_family_are_its_declarations_with_their_help() -> None:
    from hpc_rollout.handlers.harness_task import SETTINGS
    from orchestrator.agent.tool_handler import AGENT_LIMITS, CONTEXT_KEYS

    for schema, cls in ((AGENT_LIMITS, AgentLimits), (CONTEXT_KEYS, ContextPolicy), (SETTINGS, HarnessSettings)):
        described = {name: about for name, _, _, about in schema.rows()}
        assert list(described) == list(declarations(cls))
        for name, spec in declarations(cls).items():
            assert described[name].startswith(spec.help) and all(choice in described[name] for choice in spec.choices)
    assert dict((name, kind) for name, kind, _, _ in AGENT_LIMITS.rows())["max_wall_s"] == "number"
