"""Slow spool I/O (a loaded shared filesystem) must not stall the worker's heartbeat."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.spool import shards
from orchestrator.config import RunConfig
from orchestrator.report.status import pending_count
from orchestrator.submission.submit import submit_file
from orchestrator.worker.engine import Worker
from orchestrator.worker.options import WorkerOptions
from tests.core.util import make_run, rows, write_jsonl

SLOW_WRITE_S = 3.0


def test_heartbeats_go_on_while_a_shard_write_is_slow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = make_run(tmp_path / "run", **{"leases.heartbeat_s": 0.1})
    real_write = shards.write_durably

    def slow_write(table: Any, path: Path) -> None:  # a shared filesystem taking its time
        time.sleep(SLOW_WRITE_S)
        real_write(table, path)

    monkeypatch.setattr(shards, "write_durably", slow_write)
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"i": i}} for i in range(3)]))
    worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions())
    beats: list[float] = []
    watching = threading.Event()

    def watch() -> None:  # from outside the worker's event loop
        heartbeat = paths.heartbeat(worker.worker_id)
        while not watching.is_set():
            try:
                stamp = heartbeat.stat().st_mtime
            except FileNotFoundError:
                stamp = 0.0
            if stamp and (not beats or stamp != beats[-1]):
                beats.append(stamp)
            time.sleep(0.02)

    async def main() -> None:
        serving = asyncio.create_task(worker.serve())
        while pending_count(paths):
            await asyncio.sleep(0.05)
        worker.request_stop()
        await serving

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        asyncio.run(main())
    finally:
        watching.set()
        watcher.join()
    assert len(rows(paths)) == 3
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    assert beats and max(gaps) < SLOW_WRITE_S * 0.6, f"heartbeat stalled for {max(gaps):.1f}s during a slow shard write"
