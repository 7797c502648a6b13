"""Instance keys are checked at submit against the handler's schema (with a suggestion for a typo),
and `hpc-rollout handlers [NAME]` lists the handlers and their fields (issue 24, item 4)."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from hpc_rollout.handlers.bundled.write import write_bundled
from orchestrator.handler_api import contract as handler_module
from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import ENTRY_POINT_GROUP, AgentHandler, check_instance, load_handler
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key
from orchestrator.report.status import pending_count
from tests.core.util import cli, make_run, write_jsonl

SHIPPED = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.value.startswith("hpc_rollout.handlers."))


def submit_rows(tmp_path: Path, rows: list[Any], *extra: str) -> tuple[int, str, Path]:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "tasks.jsonl", rows)
    done = cli("submit", str(paths.root), str(tasks), *extra, check=False)
    return done.returncode, done.stderr, tasks


@pytest.mark.parametrize(("row", "said"), [
    ({"handler": "sleep", "instance": {"run_s": 1.0}}, "unknown key 'run_s' (did you mean 'run'?)"),
    ({"handler": "chat", "instance": {"messages": [{"role": "user", "content": "hi"}], "user_turn": ["more"]}},
     "unknown key 'user_turn' (did you mean 'user_turns'?)"),
    ({"handler": "sleep", "instance": {"run": 1, "fail": {"rnu": 1.0}}}, "unknown key 'fail.rnu' (did you mean 'fail.run'?)"),
    ({"handler": "shell", "instance": {"commands": "ls"}}, "key 'commands' must be list, got string 'ls'"),
    ({"handler": "sleep", "instance": {"xyzzy": 1}}, "unknown key 'xyzzy'; sleep takes: init, run, eval"),
    ({"handler": "code", "instance": {"statement": "add", "tests": [], "time_limit": 2}},
     "unknown key 'time_limit' (did you mean 'time_limit_s'?)"),
], ids=["sleep run_s", "chat user_turn", "nested fail.rnu", "type", "no close match", "code time_limit"])
def test_submit_refuses_unknown_keys_with_the_key_meant(tmp_path: Path, row: dict[str, Any], said: str) -> None:
    code, stderr, tasks = submit_rows(tmp_path, [row])
    assert code == 1 and f"{tasks}:1: " in stderr and said in stderr, stderr
    assert pending_count(make_run(tmp_path / "run")) == 0


def test_good_rows_and_verl_rows_pass(tmp_path: Path) -> None:
    verl = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1+1? ####"}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"index": 7, "split": "train"}}
    code, stderr, _ = submit_rows(tmp_path, [
        {"handler": "sleep", "instance": {"run": {"uniform": [0, 1]}, "fail": {"run": 0.1}, "seed": 3, "instance_id": "a"}},
        {"handler": "echo", "instance": {"anything": ["goes"], "reward": 0.5}},
        {"handler": "shell", "instance": {"commands": ["true"], "timeout": 5}},
        verl,
    ], "--source-handler", "openai/gsm8k=answer")
    assert code == 0, stderr


def test_every_shipped_handler_declares_its_schema() -> None:
    assert {"echo", "sleep", "shell", "chat", "answer", "math", "code", "swe", "harness"} <= set(SHIPPED)
    for name in SHIPPED:
        schema = load_handler(name).instance_schema
        assert isinstance(schema, InstanceSchema), f"{name} has no instance schema"
        for row in schema.rows():
            assert row[3], f"{name}: key {row[0]} has no description"


def test_the_bundled_task_sets_pass_their_schemas(tmp_path: Path) -> None:
    bundled = write_bundled(tmp_path / "bundled")
    for family in ("math", "code", "swe"):
        for line in bundled.tasks(family).read_text().splitlines():
            row = json.loads(line)
            check_instance(load_handler(family), row)
            check_instance(load_handler("harness"), {**row, "harness": {"command": "true", "max_calls": 3}})


class Schemaless(AgentHandler):
    name = "schemaless"

    async def init(self, ctx: JobContext) -> dict[str, Any]:
        return {}

    async def run(self, ctx: JobContext, prepared: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        return {"reward": 1.0}


def test_a_handler_without_a_schema_is_not_checked(tmp_path: Path) -> None:
    handler_module._loaded["schemaless"] = Schemaless
    try:
        check_instance(load_handler("schemaless"), {"whatever": 1, "run_s": 2})
    finally:
        handler_module._loaded.pop("schemaless", None)


def test_schema_defaults_and_listing() -> None:
    schema = InstanceSchema((instance_key("run", (Kind.NUMBER, Kind.OBJECT), "seconds of RUN", default=0.0),
                             instance_key("fail", Kind.OBJECT, "failure probabilities",
                                 keys=InstanceSchema((instance_key("run", Kind.NUMBER, "probability"),)))))
    assert schema.value({}, "run") == 0.0 and schema.value({"run": 2}, "run") == 2
    assert schema.rows() == [("run", "number or object", "default 0.0", "seconds of RUN"),
                             ("fail", "object", "", "failure probabilities"), ("fail.run", "number", "", "probability")]
    assert schema.problems({"run": True}) == ["key 'run' must be number or object, got boolean True"]


def test_handlers_lists_every_handler_and_one_handler_s_fields() -> None:
    listing = cli("handlers").stdout
    for name in SHIPPED:
        assert name in listing
    sleep = cli("handlers", "sleep").stdout
    assert "run" in sleep and "number or object" in sleep and "fail.run" in sleep, sleep
    assert "hpc-rollout submit" in sleep, "an example row"
    wrong = cli("handlers", "slep", check=False)
    assert wrong.returncode == 1 and "did you mean 'sleep'" in wrong.stderr, wrong.stderr


def test_handlers_says_when_a_handler_has_no_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from orchestrator.cli import cli as root

    handler_module._loaded["schemaless"] = Schemaless
    monkeypatch.setattr("orchestrator.cli.handlers.available_handlers",
                        lambda: {**dict((ep.name, ep) for ep in entry_points(group=ENTRY_POINT_GROUP)),
                                 "schemaless": None})
    try:
        shown = CliRunner().invoke(root, ["handlers", "schemaless"])
        listing = CliRunner().invoke(root, ["handlers"])
    finally:
        handler_module._loaded.pop("schemaless", None)
    assert shown.exit_code == 0 and "no instance schema" in shown.output and "not checked" in shown.output, shown.output
    assert "schemaless" in listing.output and "no schema" in listing.output, listing.output


def test_an_unknown_key_holding_null_is_absent_as_parquet_says_it() -> None:
    """A Parquet file (or verl's batch) has every column in every row: a null in another
    handler's column stands for "not there", while a value in it is still refused."""
    sleep = load_handler("sleep")
    check_instance(sleep, {"run": 1.0, "prompt": None, "user_turns": None})
    with pytest.raises(ValueError, match="unknown key 'user_turns'"):
        check_instance(sleep, {"run": 1.0, "user_turns": ["more"]})


def test_a_verl_row_may_carry_the_keys_verls_dataset_lifts_to_the_top() -> None:
    answer = load_handler("answer")
    check_instance(answer, {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "2+2?"}],
                            "reward_model": {"ground_truth": "4"}, "extra_info": {"index": 0},
                            "tools_kwargs": {}, "interaction_kwargs": {}})
