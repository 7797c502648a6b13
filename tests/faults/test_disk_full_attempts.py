"""A full spool is the infrastructure's fault, not the job's: it must cost no job an attempt.

On a spool that is a small tmpfs (a real ENOSPC), filled up and freed again a moment later:
real workers whose jobs meet the full spool between their stages, and a handler whose own write
into its job's directory meets it; every job must still end `ok` on its first attempt.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.handler_api import contract as handler_module
from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.report.status import pending_count
from orchestrator.spool.events import events_named
from orchestrator.submission.submit import submit_file
from tests.core.util import make_run, rows, serve_in_process, start_worker, stop_worker, wait_until, write_jsonl
from tests.faults.helpers import fill_disk, small_tmpfs

JOBS = 32
FULL_FOR_S = 2.0


def test_jobs_between_stages_when_the_spool_fills_up_are_charged_no_attempt(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", 16) as disk:
        paths = make_run(disk / "run", **{"jobs.max_attempts": 2})
        # RUN keeps 4 slots busy for about 4 s: the spool fills up while jobs are still finishing RUN.
        sleepy = {"handler": "sleep", "instance": {"init": 0.05, "run": 0.5, "eval": 0.05}}
        submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [sleepy] * JOBS))
        # INIT and RUN on one worker, EVAL on another: every finished RUN is a ticket saved on its
        # way to queue/eval, so the full spool meets jobs between their stages.
        workers = [start_worker(paths, "--stages", "init,run", "--init-pool", "4", "--run-pool", "4"),
                   start_worker(paths, "--stages", "eval", "--eval-pool", "2")]
        try:
            wait_until(lambda: len(rows(paths)) >= 1, 60, "the first row")
            filler = fill_disk(disk)
            time.sleep(FULL_FOR_S)
            filler.unlink()
            wait_until(lambda: pending_count(paths) == 0, 90, "the queues to drain")
        finally:
            codes = [stop_worker(worker) for worker in workers]

        got = rows(paths)
        assert codes == [0, 0], codes
        assert len(got) == JOBS and len({row["job_id"] for row in got}) == JOBS
        assert {row["status"] for row in got} == {"ok"}, [row["error"] for row in got if row["status"] != "ok"]
        charged = [row["attempt"] for row in got if row["attempt"] != 1]
        assert charged == [], f"{len(charged)} job(s) were charged an attempt for the full spool"
        returned = events_named(paths, "spool_full_requeued")
        assert returned, "no job met the full spool between its stages: the test proved nothing"
        assert {(event["attempt"], event["charged"]) for event in returned} == {(1, False)}


class FillsTheSpoolOnce(AgentHandler):
    """RUN writes an artifact into its job's directory; its first RUN fills the spool first, and a
    timer frees it a second later: the write fails with ENOSPC through no fault of the job."""

    name = "fills_the_spool_once"
    disk: Path
    runs: list[int] = []

    async def init(self, ctx: JobContext) -> dict[str, Any]:
        return {}

    async def run(self, ctx: JobContext, prepared: dict[str, Any]) -> dict[str, Any]:
        self.runs.append(ctx.attempt)
        if len(self.runs) == 1:
            filler = fill_disk(self.disk)
            threading.Timer(1.0, filler.unlink).start()
        (ctx.artifact_dir() / "artifact.bin").write_bytes(b"x" * (1 << 16))
        return {"artifact_bytes": 1 << 16}

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        return {"reward": 1.0}


@pytest.fixture
def fills_the_spool_once() -> Iterator[type[FillsTheSpoolOnce]]:
    FillsTheSpoolOnce.runs = []
    handler_module._loaded[FillsTheSpoolOnce.name] = FillsTheSpoolOnce
    yield FillsTheSpoolOnce
    handler_module._loaded.pop(FillsTheSpoolOnce.name, None)


def test_a_handler_write_that_finds_the_spool_full_costs_its_job_no_attempt(
        tmp_path: Path, fills_the_spool_once: type[FillsTheSpoolOnce]) -> None:
    with small_tmpfs(tmp_path / "disk", 16) as disk:
        fills_the_spool_once.disk = disk
        paths = make_run(disk / "run")
        submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": FillsTheSpoolOnce.name, "instance": {}}]))
        serve_in_process(paths, timeout=30)

        [row] = rows(paths)
        assert fills_the_spool_once.runs == [1, 1], "RUN must meet the full spool once, then run again as attempt 1"
        assert (row["status"], row["attempt"]) == ("ok", 1), row["error"]
        assert (paths.job_dir(row["job_id"]) / "artifact.bin").stat().st_size == 1 << 16
