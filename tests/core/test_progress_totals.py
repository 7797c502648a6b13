"""The progress bar of `launch --wait` and `demo` counts each job once, from submission to shard
(issue 39, item 1: a 20-job submission showed 4/24 and 12/24): its total is the jobs submitted
(accepted rows x samples; a rejected row adds none), whatever queue, claim, batch or attempt a
job is in, and its count is the jobs with a row. Retries and requeues change neither."""

from __future__ import annotations

import asyncio
import io
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest
from rich.console import Console

from orchestrator.cli.progress import DrainResult, progress_until_drained
from orchestrator.config import RunConfig
from orchestrator.handler_api.context import JobContext
from orchestrator.spool import fsops
from orchestrator.spool.batches import batch_name
from orchestrator.spool.paths import SpoolPaths
from orchestrator.submission.submit import submit_file
from orchestrator.worker.engine import Worker
from orchestrator.worker.options import WorkerOptions
from tests.core.util import make_run, rows, write_jsonl

SLOW = {"handler": "sleep", "instance": {"init": 0.1, "run": 0.4, "eval": 0.1}}
REJECTED = {"handler": "sleep", "instance": {"run_s": 0.4}}   # unknown key: refused at submit
DEAD = "deadnode-1-gone"


class Bar:
    """`progress_until_drained` in a thread, drawing on a terminal of its own: every done/total it shows."""

    def __init__(self, paths: SpoolPaths) -> None:
        self.screen = io.StringIO()
        self.stopped = threading.Event()
        self.result: DrainResult | None = None
        console = Console(file=self.screen, force_terminal=True, width=200)

        def watch() -> None:
            self.result = progress_until_drained(paths, console, lambda: not self.stopped.is_set(), poll_s=0.05)

        self.thread = threading.Thread(target=watch, daemon=True)
        self.thread.start()

    def shown(self) -> list[tuple[int, int]]:
        """The done/total pairs drawn, in order (rich redraws the bar ten times a second)."""
        self.stopped.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the bar did not end"
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", self.screen.getvalue())
        return [(int(done), int(total)) for done, total in re.findall(r"\bjobs\b.*?\s(\d+)/(\d+)\b", text)]


def serve_until(paths: SpoolPaths, done: Callable[[], bool], timeout: float = 120, **options: Any) -> None:
    """A worker in this process (so the test can break its engine) until `done()`."""
    worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions(**options))

    async def main() -> None:
        serving = asyncio.create_task(worker.serve())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not serving.done():
            with fsops.duty("observer"):
                if done():
                    break
            await asyncio.sleep(0.1)
        worker.request_stop()
        await serving

    asyncio.run(main())


def plant_a_dead_workers_claim(paths: SpoolPaths, tmp_path: Path) -> list[str]:
    """A batch of 4 jobs claimed by a worker that died long ago: it comes back with attempt 2."""
    report = submit_file(paths, write_jsonl(tmp_path / "late.jsonl", [SLOW]), samples=4)
    entry = batch_name(report.first_job, 4)
    claims = paths.claims(DEAD)
    claims.mkdir(parents=True)
    os.rename(paths.init_queue / entry, claims / entry)
    heartbeat = paths.heartbeat(DEAD)
    heartbeat.write_bytes(orjson.dumps({"node": "deadnode", "pid": 1}))
    old = time.time() - 3600
    os.utime(heartbeat, (old, old))
    return [report.first_job, report.last_job]


@pytest.fixture
def engine_bug_once(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The first stage of the first job to ask fails outside its handler: the claim goes back, attempt + 1."""
    from orchestrator.worker.job_runner import JobRunner

    seen: dict[str, int] = {}
    real_context = JobRunner.context

    def flaky_context(self: JobRunner, ticket: Any, stage: Any) -> JobContext:
        if ticket.status is None and not seen:
            seen[ticket.name] = 1
            raise RuntimeError(f"injected transient engine error in {stage.value}")
        return real_context(self, ticket, stage)

    monkeypatch.setattr(JobRunner, "context", flaky_context)
    return seen


def test_the_bar_counts_each_submitted_job_once_through_batches_retries_and_requeues(
        tmp_path: Path, engine_bug_once: dict[str, int]) -> None:
    paths = make_run(tmp_path / "run", **{"jobs.max_attempts": 3})
    first = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [SLOW] * 3 + [REJECTED] + [SLOW] * 2), samples=4)
    assert first.jobs == 20 and len(first.rejected) == 1, "5 accepted rows x 4 samples; the rejected row queues none"
    requeued = plant_a_dead_workers_claim(paths, tmp_path)
    submitted = 24

    bar = Bar(paths)
    serve_until(paths, lambda: len(rows(paths)) >= submitted, init_pool=4, run_pool=2, eval_pool=2, max_prepared=4)
    shown = bar.shown()

    finished = {row["job_id"]: row for row in rows(paths)}
    assert len(finished) == submitted
    assert engine_bug_once and finished[next(iter(engine_bug_once))]["attempt"] == 2, "a job was retried"
    assert all(finished[job]["attempt"] == 2 for job in requeued), "the dead worker's batch was requeued"
    assert shown, "the bar was drawn"
    totals = sorted({total for _, total in shown})
    assert totals == [submitted], f"the total is the jobs submitted, never more: {totals} in {shown}"
    done = [count for count, _ in shown]
    assert done == sorted(done), f"the count never goes back: {shown}"
    assert shown[-1] == (submitted, submitted), shown[-1]
    assert bar.result is not None and bar.result.tally.retried >= 5


def test_a_later_wait_counts_only_the_jobs_left_when_it_began(tmp_path: Path) -> None:
    """Jobs that had their row before the bar started are not its work: 0/3 to 3/3, not 20/23."""
    paths = make_run(tmp_path / "run")
    submit_file(paths, write_jsonl(tmp_path / "a.jsonl", [{"handler": "echo", "instance": {}}] * 5), samples=4)
    serve_until(paths, lambda: len(rows(paths)) >= 20)
    submit_file(paths, write_jsonl(tmp_path / "b.jsonl", [SLOW] * 3 + [REJECTED]))

    bar = Bar(paths)
    serve_until(paths, lambda: len(rows(paths)) >= 23)
    shown = bar.shown()

    assert {total for _, total in shown} == {3}, shown
    assert shown[-1] == (3, 3)
