"""Fencing: a worker paused past its lease commits nothing for the claims it lost, notices,
says so, and comes back as a new worker instead of idling as a zombie."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import orjson

from orchestrator.submission.submit import submit_file
from tests.core.util import make_run, rows, start_worker, stop_worker, wait_drained, wait_until, write_jsonl


def buffered_rows(paths, pid: int) -> int:
    for heartbeat in paths.workers.glob("*.json"):
        info = orjson.loads(heartbeat.read_bytes())
        if info.get("pid") == pid:
            return int(info.get("buffered_rows", 0))
    return 0


def test_a_worker_paused_past_its_lease_commits_nothing_and_rejoins(tmp_path: Path) -> None:
    # Rows wait in the buffer (long shard age, no idle flush), so the paused worker holds some.
    paths = make_run(tmp_path / "run", **{"shards.max_age_s": 30.0, "shards.idle_flush_s": 30.0,
                                          "shards.max_rows": 40})
    profile = {"run": {"uniform": [0.01, 0.05]}, "seed": 1}
    submitted = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 200))
    steady = start_worker(paths, "--run-pool", "4")
    paused = start_worker(paths, "--run-pool", "4")
    try:
        wait_until(lambda: buffered_rows(paths, paused.pid) > 0, 60, "the worker to buffer rows")
        os.kill(paused.pid, signal.SIGSTOP)
        wait_until(lambda: not paths.claims(_worker_id_of(paths, paused.pid) or "-").exists(), 60,
                   "the paused worker's claims to be taken over")
        os.kill(paused.pid, signal.SIGCONT)
        wait_drained(paths, timeout=180)
        wait_until(lambda: _log_of(paths, paused).count("lost its lease") >= 1, 30, "the worker to say so")
        assert paused.poll() is None, "it re-registers instead of exiting"

        def incarnations() -> list[dict]:
            beats = (orjson.loads(w.read_bytes()) for w in paths.workers.glob("*.json"))
            return [b for b in beats if b.get("pid") == paused.pid]

        # (the queues may drain, their last rows committed at once, before it has re-registered)
        wait_until(lambda: [b["state"] for b in incarnations()] == ["running"], 30, "one running incarnation")
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        codes = [stop_worker(steady), stop_worker(paused)]
    assert codes == [0, 0]
    counts = Counter(r["job_id"] for r in rows(paths))
    assert len(counts) == submitted.jobs, "a job was lost"
    assert max(counts.values()) == 1, f"{sum(counts.values()) - len(counts)} duplicated rows"
    lost = [e for f in paths.events.glob("*.jsonl") for e in map(orjson.loads, f.read_bytes().splitlines())
            if e["event"] == "lease_lost"]
    assert len(lost) == 1 and lost[0]["dropped_rows"] > 0


_ids: dict[int, str] = {}


def _worker_id_of(paths, pid: int) -> str | None:
    if pid not in _ids:
        for heartbeat in paths.workers.glob("*.json"):
            if orjson.loads(heartbeat.read_bytes()).get("pid") == pid:
                _ids[pid] = heartbeat.name[:-5]
    return _ids.get(pid)


def _log_of(paths, process) -> str:
    text = ""
    for log in paths.root.glob("worker-*.log"):
        text += log.read_text(errors="replace")
    return text


def test_a_writer_fenced_before_its_first_shard_is_closed_not_left_open(tmp_path: Path) -> None:
    """A worker paused before its first commit, reaped, then resumed: its first commit registers
    the writer and fails (the claim directory is gone). The reaper closed the dead worker's
    writers before that one existed, so nobody else ever will: the writer must close itself,
    or readers probe it for ever (seen once in CI's fault mix)."""
    import pytest

    from orchestrator.config import Shards
    from orchestrator.spool.shardlog import WriterDirectory
    from orchestrator.spool.shards import FencedOut, ShardWriter

    paths = make_run(tmp_path / "run")
    writer = ShardWriter(paths, "paused-1", Shards())
    writer.add({"job_id": "j1"}, "j1")
    taken_over = paths.active / "paused-1"   # never created here: as if renamed away by a reaper
    with pytest.raises(FencedOut):
        writer.commit(taken_over)
    directory = WriterDirectory(paths)
    assert directory.open() == []
    assert directory.closed() == {"paused-1": 0}


def test_an_attempt_lost_to_fencing_is_not_charged_to_the_job(tmp_path: Path) -> None:
    """Issue 22 item 3: a worker paused past its lease while its job was at its last attempt is
    fenced; the job runs again elsewhere instead of ending `failed` (test first: it ended `failed`,
    "gave up after 1 attempts"). The fenced worker leaves workers/fenced/W, so the attempts lost
    with it are never charged, whenever they are counted (tests/core/test_recovery.py)."""
    paths = make_run(tmp_path / "run", **{"jobs.max_attempts": 1, "leases.heartbeat_s": 0.2, "leases.lease_s": 1.5})
    report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 3.0}}]))
    paused = start_worker(paths, "--worker-id", "paused-1-aaaa")
    steady = None
    try:
        wait_until(lambda: _events_of(paths, report.first_job, "run_started"), 60, "the job to run")
        os.kill(paused.pid, signal.SIGSTOP)
        steady = start_worker(paths, "--worker-id", "steady-1-bbbb")
        wait_until(lambda: not paths.claims("paused-1-aaaa").exists(), 60, "the paused worker's claim to be taken over")
        os.kill(paused.pid, signal.SIGCONT)
        wait_drained(paths, timeout=120)
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        codes = [stop_worker(paused)] + ([stop_worker(steady)] if steady is not None else [])
    assert codes == [0, 0]
    (row,) = rows(paths)
    assert (row["status"], row["attempt"]) == ("ok", 2), row
    assert (paths.workers / "fenced" / "paused-1-aaaa").exists(), "the fenced worker did not say so"


def _events_of(paths, job: str, name: str) -> list[dict]:
    return [e for f in paths.events.glob("*.jsonl") for e in map(orjson.loads, f.read_bytes().splitlines())
            if e.get("job") == job and e["event"] == name]
