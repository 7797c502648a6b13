"""Idle exit: a worker with nothing to claim and nothing in flight leaves by itself, exit 0."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import RunConfig
from orchestrator.spool import shards
from orchestrator.spool.events import events_named
from orchestrator.submission.submit import submit_file
from orchestrator.worker.engine import Worker
from orchestrator.worker.idle import IdleClock
from orchestrator.worker.options import WorkerOptions
from tests.core.util import make_run, rows, start_worker, stop_worker, write_jsonl


IDLE_S = 1.0
SLOW_WRITE_S = 2.5


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_clock_restarts_while_holding_and_when_a_job_arrives_at_the_deadline(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    clock = FakeClock()
    idle = IdleClock(5.0, clock)
    clock.now += 4.9
    assert not idle.expired(holding=False, queues=[queue])
    clock.now += 3.0
    assert not idle.expired(holding=True, queues=[queue])       # a running stage or buffered rows
    clock.now += 4.9
    assert not idle.expired(holding=False, queues=[queue])
    clock.now += 0.2
    (queue / "job-1").write_text("{}")                          # submitted just before the deadline
    assert not idle.expired(holding=False, queues=[queue])
    assert idle.idle_for() == 0.0                               # claimed and run: the window starts over
    (queue / "job-1").unlink()
    clock.now += 5.0
    assert idle.expired(holding=False, queues=[queue])
    clock.now += 5.0
    assert not idle.expired(holding=False, queues=[queue], claims=1)   # a claim since the last look
    clock.now += 5.5
    assert idle.expired(holding=False, queues=[queue], claims=1)
    assert not IdleClock(0.0, clock).expired(holding=False, queues=[queue])   # 0: never


def test_a_worker_leaves_once_idle_after_committing_its_buffered_rows(tmp_path: Path) -> None:
    # Rows wait up to 3 s for their shard: the worker must commit them before its idle window runs.
    paths = make_run(tmp_path / "run", **{"shards.idle_flush_s": 3.0, "shards.max_age_s": 3.0})
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 0.2}}] * 6))
    worker = start_worker(paths, "--idle-exit", "1")
    try:
        assert worker.wait(timeout=60) == 0
    finally:
        stop_worker(worker)
    assert len(rows(paths)) == 6
    (left,) = events_named(paths, "idle_exit")
    committed_at = max(p.stat().st_mtime for p in paths.shards.glob("*.parquet"))
    # The clock samples every idle_exit_s / 4: the window starts at the last sample still holding rows.
    assert left["t"] - committed_at >= 1.0 - 0.25 - 0.05, "left before its window started at the last commit"
    assert left["idle_s"] >= 1.0
    assert not list(paths.workers.glob("*.json")), "its heartbeat should be retired"
    assert [p.name for p in (paths.workers / "gone").glob("*.json")]
    (stopped,) = events_named(paths, "worker_stopped")
    assert stopped["state"] == "stopped" and stopped["finished"] == 6


def test_the_idle_window_does_not_start_while_a_shard_is_being_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard write that takes its time (a loaded shared filesystem): its rows are out of the buffer
    but not committed yet, so the worker still holds them and its idle window waits for the commit."""
    paths = make_run(tmp_path / "run")
    real_write = shards.write_durably
    written_at: list[float] = []

    def slow_write(table: Any, path: Path) -> None:
        time.sleep(SLOW_WRITE_S)
        real_write(table, path)
        written_at.append(time.time())

    monkeypatch.setattr(shards, "write_durably", slow_write)
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 0.1}}] * 3))
    worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions(idle_exit_s=IDLE_S))
    asyncio.run(worker.serve())
    assert len(rows(paths)) == 3 and written_at
    (left,) = events_named(paths, "idle_exit")
    assert left["t"] - max(written_at) >= IDLE_S - 0.3, "the idle window ran while the rows were being written"
