"""Waits that end when a ticket or a shard lands here (inotify), the polls kept for other nodes.

A trainer that submits a step and waits for its rows paid half a poll twice a step: the idle
worker's stat of its queue (50 ms) and the reader's poll. Each test makes the poll an hour long,
so only the watch can end the wait in time; the same tests failed before the watch existed."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from orchestrator.config import RunConfig, Shards
from orchestrator.spool import dir_watch, fsops
from orchestrator.spool.dir_watch import DirWatch
from orchestrator.spool.shards import ShardWriter
from orchestrator.submission.submit import submit_file
from orchestrator.trainer.tail import RowReader
from orchestrator.worker import dispatch
from orchestrator.worker.engine import Worker
from orchestrator.worker.options import WorkerOptions
from tests.core.util import make_run, rows, write_jsonl

HOUR = 3600.0
IN_TIME_S = 20.0   # far below the hour-long poll: only a wake-up ends the wait within it


def later(seconds: float, action: object) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        action()   # type: ignore[operator]

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_published_file_ends_the_wait_and_temporaries_do_not(tmp_path: Path) -> None:
    queue, other = tmp_path / "queue", tmp_path / "other"
    queue.mkdir()
    other.mkdir()
    with DirWatch([queue]) as watch:
        assert watch.active and watch.fileno() is not None
        (queue / ".ticket.tmp").write_text("{}")    # an atomic write's temporary: not yet a ticket
        (other / "ticket").write_text("{}")         # a directory nobody watches
        assert watch.wait(0.05) == set()
        fsops.write_atomic(queue / "ticket", b"{}")   # the temporary renamed into place
        assert watch.wait(HOUR) == {queue}
        assert watch.changed() == set()             # each event is reported once
        assert not watch.add(tmp_path / "missing")   # refused, not raised: its waits poll


def test_without_inotify_a_wait_is_the_poll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dir_watch, "_inotify_fd", lambda: None)   # not Linux, or the per-user limit reached
    with DirWatch([tmp_path]) as watch:
        assert not watch.active and watch.fileno() is None
        began = time.monotonic()
        fsops.write_atomic(tmp_path / "ticket", b"{}")
        assert watch.wait(0.2) == set()
        assert time.monotonic() - began >= 0.2


def test_events_lost_to_an_overflow_count_as_every_directory_changed(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    with DirWatch([first, second]) as watch:
        overflow = dir_watch._EVENT.pack(-1, dir_watch.IN_Q_OVERFLOW, 0, 0)
        assert watch._parse(overflow) == {first, second}


def test_a_reader_waiting_for_rows_wakes_when_a_shard_is_committed(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    writer = ShardWriter(paths, "node-1-aa", Shards())
    reader = RowReader(paths, poll_s=HOUR)
    row = {"job_id": "g-0000", "group_id": "g", "group_size": 1, "sample_index": 0, "status": "ok", "reward": 1.0}

    def commit() -> None:
        writer.add(row, row["job_id"])
        writer.commit()

    began = time.monotonic()
    committer = later(0.3, commit)
    group = reader.next_group(timeout_s=IN_TIME_S)   # polls once, then only a wake-up ends it early
    committer.join()
    reader.close()
    assert group is not None and group[0]["job_id"] == "g-0000"
    assert time.monotonic() - began < IN_TIME_S


def test_an_idle_worker_claims_a_new_ticket_without_waiting_for_its_poll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for period in ("QUEUE_WATCH_S", "MIN_IDLE_BACKOFF_S", "MAX_IDLE_BACKOFF_S"):
        monkeypatch.setattr(dispatch, period, HOUR)   # asleep for an hour after its first empty look
    paths = make_run(tmp_path / "run", **{"shards.idle_flush_s": 0.01})
    worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions(runtime="local", idle_exit_s=0))
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"text": "hi"}}])

    async def main() -> float:
        serving = asyncio.create_task(worker.serve())
        await asyncio.sleep(1.0)                    # every dispatcher found its queue empty: asleep
        submitted = time.monotonic()
        submit_file(paths, tasks)
        while not rows(paths) and time.monotonic() - submitted < IN_TIME_S and not serving.done():
            await asyncio.sleep(0.05)
        took = time.monotonic() - submitted
        worker.request_stop()
        await serving
        return took

    took = asyncio.run(main())
    assert [r["status"] for r in rows(paths)] == ["ok"], f"no row within {IN_TIME_S} s of the submit"
    assert took < IN_TIME_S
