"""A trainer waits on the first and the last job of every step: a worker neither sleeps through
new tickets nor sits on the last rows.

- An idle dispatcher backs off up to MAX_IDLE_BACKOFF_S between listings of its empty queue;
  meanwhile it watches the queue directory itself (one stat) and claims as soon as it changes.
- Rows are buffered into shards (idle_flush_s, max_age_s); a worker that holds no job any more
  has nothing to batch them with and commits them at once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable

import pytest

from orchestrator.trainer.api import Spool
from orchestrator.config import RunConfig
from orchestrator.worker import dispatch
from orchestrator.worker.engine import Worker
from orchestrator.worker.options import WorkerOptions
from tests.core.util import make_run, rows


def serve_until(worker: Worker, done: Callable[[], bool], timeout: float) -> float:
    """Serve in this process until `done()`; the seconds it took (timeout: AssertionError)."""
    async def main() -> float:
        serving = asyncio.create_task(worker.serve())
        began = time.monotonic()
        try:
            while not done():
                assert not serving.done(), "the worker stopped"
                assert time.monotonic() - began < timeout, f"not done within {timeout} s"
                await asyncio.sleep(0.02)
            return time.monotonic() - began
        finally:
            worker.request_stop()
            await serving

    return asyncio.run(main())


def test_an_idle_worker_claims_a_new_ticket_without_sleeping_out_its_backoff(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Backoffs of 30 s: without watching the queue, the ticket would wait that long.
    monkeypatch.setattr(dispatch, "MIN_IDLE_BACKOFF_S", 30.0)
    monkeypatch.setattr(dispatch, "MAX_IDLE_BACKOFF_S", 30.0)
    paths = make_run(tmp_path / "run")
    worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions())
    spool = Spool.open(paths.root)
    submitted: list[float] = []

    def done() -> bool:
        if not submitted:
            if time.monotonic() - started < 1.0:
                return False   # the dispatchers found their queues empty: asleep for 30 s now
            spool.submit([{"reward": 1.0}], handler="echo")
            submitted.append(time.monotonic())
            return False
        return len(rows(paths)) == 1

    started = time.monotonic()
    serve_until(worker, done, timeout=60)
    assert time.monotonic() - submitted[0] < 15, "the idle worker slept out its backoff"
    assert rows(paths)[0]["status"] == "ok"


def test_init_starts_the_next_job_as_soon_as_one_finishes_not_at_its_room_recheck(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # INIT prepares at most max_prepared jobs ahead; it waited for room by re-checking every 50 ms,
    # and a finished INIT did not wake it: a step's first 20 jobs reached RUN 4 per 50 ms (a quarter
    # of a second of partly empty model batches at every verl step). Re-checks of 30 s make it plain.
    monkeypatch.setattr(dispatch, "ROOM_RECHECK_S", 30.0)
    paths = make_run(tmp_path / "run")
    Spool.open(paths.root).submit([{"reward": 1.0}] * 6, handler="echo")
    worker = Worker(paths, RunConfig.load(paths.run_config),
                    WorkerOptions(init_pool=6, run_pool=6, eval_pool=6, max_prepared=1))
    seconds = serve_until(worker, lambda: len(rows(paths)) == 6, timeout=60)
    assert seconds < 15, "INIT waited out its room re-check"


def test_the_last_rows_are_committed_once_the_worker_holds_no_job(tmp_path: Path) -> None:
    # A row would wait up to a minute for its shard: idle_flush_s and max_age_s say so.
    paths = make_run(tmp_path / "run", **{"shards.idle_flush_s": 60.0, "shards.max_age_s": 60.0})
    Spool.open(paths.root).submit([{"reward": 1.0}, {"reward": 0.0}], handler="echo", samples=2)
    worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions())
    seconds = serve_until(worker, lambda: len(rows(paths)) == 4, timeout=30)
    assert seconds < 15
    assert sorted(r["reward"] for r in rows(paths)) == [0.0, 0.0, 1.0, 1.0]


def test_a_duty_woken_as_it_is_cancelled_still_stops() -> None:
    """The commit duty can be woken (a job left) in the very step the stopping worker cancels it:
    the cancellation must win, or the worker waits for that task forever."""
    from orchestrator.worker.periodic import every

    async def main() -> bool:
        wake = asyncio.Event()
        task = asyncio.create_task(every(10.0, lambda: None, wake))
        await asyncio.sleep(0.05)   # the duty waits for its period or its wake-up
        wake.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
        return bool(done) and task.cancelled()

    assert asyncio.run(main())
