"""The `shell` handler through the real JobContext contract: INIT, RUN (re-attached), EVAL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.handler_api.context import JobContext, WorkerServices
from orchestrator.handler_api.contract import load_handler
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import SpoolPaths, current_node
from tests.sandbox.helpers import needs_bwrap, run, sandbox_processes

pytestmark = needs_bwrap


def _ctx(spool: SpoolPaths, instance: dict[str, Any], stage: Stage, state: dict[str, Any]) -> JobContext:
    job = JobSpec(job_id="s-000001-000", group_id="s-000001", instance_id="s-000001",
                  sample_index=0, handler="shell", instance=instance)
    services = WorkerServices(paths=spool, worker_id="w1", node=current_node(),
                              runtime="bwrap", sandbox_defaults={"keep_workspace": True})
    return JobContext(job=job, stage=stage, attempt=1, services=services, state=state)


def _stages(spool: SpoolPaths, instance: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    handler = load_handler("shell")
    handler.validate_instance(instance)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        state: dict[str, Any] = {}
        init_ctx = _ctx(spool, instance, Stage.INIT, state)
        prepared = await handler.init(init_ctx)
        # RUN gets a fresh context (as in another worker process): it re-attaches.
        run_ctx = _ctx(spool, instance, Stage.RUN, dict(init_ctx.state))
        try:
            result = await handler.run(run_ctx, prepared)
        finally:
            await run_ctx.close_runtime()
        scored = await handler.eval(_ctx(spool, instance, Stage.EVAL, {}), result)
        return prepared, result, scored

    return run(scenario())


def test_commands_run_in_the_sandbox_and_reward_one(spool: SpoolPaths, private_runtime: Path) -> None:
    prepared, result, scored = _stages(spool, {"commands": ["echo hi > out.txt", "cat out.txt", "exit 4"],
                                               "expect": "hi"})
    assert prepared["sandbox_kind"] == "bwrap"
    assert [s["exit_code"] for s in result["steps"]] == [0, 0, 4]
    assert result["steps"][1]["output"] == "hi\n"
    assert scored == {"reward": 1.0}
    [kept] = spool.job_dir("s-000001-000").glob("workspace-kept.*")
    assert (kept / "out.txt").read_text() == "hi\n"
    assert sandbox_processes(private_runtime) == []


def test_missing_expectation_scores_zero(spool: SpoolPaths) -> None:
    _, _, scored = _stages(spool, {"commands": ["echo bye"], "expect": "hi"})
    assert scored == {"reward": 0.0}


def test_invalid_instances_are_rejected_at_submit() -> None:
    handler = load_handler("shell")
    for bad, message in (({}, "commands"), ({"commands": "ls"}, "commands"),
                         ({"commands": ["ls"], "timeout": -1}, "timeout")):
        with pytest.raises(ValueError, match=message):
            handler.validate_instance(bad)
