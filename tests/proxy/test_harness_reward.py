"""A reward the harness reports itself ($HPC_ROLLOUT_REWARD_FILE), through a real worker and real
bubblewrap sandboxes (the host's /usr): with harness.reward = "reported" it is the row's reward
when it is a number in range, and a failed job naming the problem otherwise; with the default
"family" the family's EVAL scores and the report is kept beside it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.spool.rundir import init_run
from orchestrator.submission.submit import submit_rows
from tests.core.util import FAST, rows, serve_in_process
from tests.proxy.conftest import Backend, needs_bwrap, scripted_backend

pytestmark = [needs_bwrap, pytest.mark.llm]

CASES: dict[str, tuple[str, dict[str, Any]]] = {   # instance id: (what the harness writes, harness settings)
    "number": ("0.75", {"reward": "reported"}),
    "object": ('{"reward": 3, "note": "self-scored"}', {"reward": "reported", "reward_range": [0, 5]}),
    "too_high": ("1.5", {"reward": "reported"}),
    "not_a_number": ('"high"', {"reward": "reported"}),
    "boolean": ("true", {"reward": "reported"}),
    "missing": ("", {"reward": "reported"}),
    "family": ("0.75", {}),
}


@pytest.fixture(scope="module")
def reward_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    yield from scripted_backend(tmp_path_factory.mktemp("reward"), [{"match": "", "replies": ["unused"]}])


def test_reported_rewards_are_checked_by_type_and_range(tmp_path: Path, reward_backend: Backend) -> None:
    paths, _ = init_run(reward_backend.paths.root, {**FAST, "sandbox.runtime": "bwrap", "sandbox.image": ""})
    tasks = []
    for name, (written, settings) in CASES.items():
        command = f"printf %s '{written}' > \"$HPC_ROLLOUT_REWARD_FILE\"" if written else "true"
        tasks.append({"instance_id": name, "problem": "What is 1 + 1?", "answer": "2",
                      "harness": {"command": command, "family": "math", **settings}})
    report = submit_rows(paths, enumerate(tasks, 1), handler="harness")
    assert not report.rejected, report.rejected
    serve_in_process(paths, timeout=300, run_pool=4)
    found = {r["instance_id"]: r for r in rows(paths)}

    assert (found["number"]["status"], found["number"]["reward"]) == ("ok", 0.75)
    assert json.loads(found["number"]["result"])["reward_source"] == "reported"
    assert (found["object"]["status"], found["object"]["reward"]) == ("ok", 3.0)
    problems = {
        "too_high": "1.5 is outside the harness reward_range [0, 1]",
        "not_a_number": "'high' is not a finite number",
        "boolean": "True is not a finite number",
        "missing": "the harness reported no reward",
    }
    for name, problem in problems.items():
        row = found[name]
        assert row["status"] == "failed" and row["reward"] is None and row["error_stage"] == "eval", row["error"]
        assert problem in row["error"], row["error"]
    family = found["family"]
    assert family["status"] == "ok" and family["reward"] == 0.0       # math: no answer given
    assert json.loads(family["result"])["reported_reward"] == 0.75     # kept beside the family's reward


def test_bad_reward_settings_are_refused_at_submit(reward_backend: Backend) -> None:
    bad = [{"problem": "x", "answer": "2", "harness": {"command": "true", "reward": "self"}},
           {"problem": "x", "answer": "2", "harness": {"command": "true", "reward_range": [1, 0]}}]
    report = submit_rows(reward_backend.paths, enumerate(bad, 1), handler="harness")
    reasons = [p.reason for p in report.rejected]
    assert len(reasons) == 2 and "choose one of family, reported" in reasons[0] and "low <= high" in reasons[1]
