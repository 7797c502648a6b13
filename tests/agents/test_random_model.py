"""The random tiny model (serve-llm --tiny: untrained, so malformed and rambling) against every
task family through real workers and sandboxes: every job ends with a row and a stop reason,
and no sandbox is left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_rollout.handlers.bundled.write import Bundled
from orchestrator.devserver.local_server import local_server
from tests.agents.conftest import needs_bwrap
from tests.agents.helpers import new_run, rows, run_workers, select, submit
from tests.sandbox.helpers import sandbox_processes

pytestmark = [needs_bwrap, pytest.mark.llm]
STOP_REASONS = {"finished", "truncated", "max_turns", "context_full", "timeout", "error", "cancelled"}


def test_random_model_every_job_ends_with_a_row_and_a_stop_reason(
        tmp_path: Path, task_image: Path, bundled: Bundled, private_runtime: Path) -> None:
    tight = {"max_turns": 2, "max_context_tokens": 1200, "max_wall_s": 60, "tool_timeout_s": 5}

    def limited(row: dict) -> dict:
        return {**row, "agent": tight}

    with local_server(tiny=True) as url:
        paths = new_run(tmp_path, task_image, url, **{"sandbox.allowed_binds": [str(bundled.mirrors)]})
        jobs = 0
        for family, count in (("math", 1), ("code", 1), ("swe", 1)):
            subset = select(bundled.tasks(family), tmp_path / f"{family}.jsonl", count, limited)
            jobs += submit(paths, subset, family, samples=1, max_tokens=48, temperature=1.0)
        # Sandboxes in the short runtime dir: under tmp_path (longer with pytest-xdist's
        # popen-gwN/) their socket paths could pass the 108-byte limit.
        run_workers(paths, private_runtime)
    found = rows(paths)
    assert len(found) == jobs
    for row in found:
        assert row["stop_reason"] in STOP_REASONS, row
        assert row["status"] == "ok", (row["instance_id"], row["error"])
        assert row["reward"] in (0.0, 1.0)
        assert len(row["response_ids"]) == len(row["response_mask"]) == len(row["logprobs"])
        assert sum(row["response_mask"]) == sum(len(t["output_ids"]) for t in row["turns"])
        assert len(row["prompt_ids"]) + len(row["response_ids"]) <= 1200 + 48
    # code and swe nudge a reply without a call; with 2 turns they stop at the limit or earlier
    assert {r["stop_reason"] for r in found if r["handler"] != "math"} <= {"max_turns", "context_full", "finished"}
    assert sandbox_processes(private_runtime) == []
    assert json.loads(found[0]["instance"])["agent"] == tight
