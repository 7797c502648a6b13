"""A worker fenced out while the spool is full waits for room to re-register, instead of dying.

A worker paused past its lease comes back, finds its claims taken over and re-registers as a
new worker in the same process (worker/main.py). Registering writes files (a heartbeat, a claim
directory, a journal, an event log): on a full spool the first write fails. The worker must wait
and try again once there is room, not exit 1 with a traceback, and at the end it stops cleanly
with every job in exactly one row. (In the fault mix on the NFS-like view, the lease loss and the
full spool came close enough together for this to happen, 1 run in ~20.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson

from orchestrator.spool.paths import SpoolPaths
from orchestrator.submission.submit import submit_file
from tests.core.util import make_run, rows, stop_worker, wait_drained, wait_until, write_jsonl
from tests.faults.helpers import fill_disk, small_tmpfs

SETTINGS = {"leases.heartbeat_s": 0.3, "leases.lease_s": 2.0, "shards.max_age_s": 0.5,
            "shards.idle_flush_s": 0.2, "shutdown.grace_s": 5.0}


def start_worker_logging_to(paths: SpoolPaths, log_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """A real worker whose log is off the spool's disk (a full spool must not silence it)."""
    log = open(log_path, "wb")
    return subprocess.Popen([sys.executable, "-m", "orchestrator.worker", str(paths.root), "-v", *args],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def worker_id_of(paths: SpoolPaths, pid: int) -> str | None:
    for heartbeat in paths.workers.glob("*.json"):
        try:
            if orjson.loads(heartbeat.read_bytes()).get("pid") == pid:
                return heartbeat.name[:-5]
        except ValueError:
            continue
    return None


def running_incarnations(paths: SpoolPaths, pid: int) -> list[str]:
    found = []
    for heartbeat in paths.workers.glob("*.json"):
        try:
            info = orjson.loads(heartbeat.read_bytes())
        except ValueError:
            continue
        if info.get("pid") == pid and info.get("state") == "running":
            found.append(heartbeat.name[:-5])
    return found


def test_a_worker_fenced_on_a_full_spool_rejoins_once_there_is_room(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", 32) as disk:
        paths = make_run(disk / "run", **SETTINGS)
        profile = {"run": {"uniform": [0.2, 0.6]}, "seed": 3}
        submitted = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 60))
        steady = start_worker_logging_to(paths, tmp_path / "steady.log", "--run-pool", "2")
        paused = start_worker_logging_to(paths, tmp_path / "paused.log", "--run-pool", "2")
        log = tmp_path / "paused.log"
        filler: Path | None = None
        try:
            wait_until(lambda: (wid := worker_id_of(paths, paused.pid)) is not None
                       and any(paths.claims(wid).glob("*")), 60, "the worker to hold claims")
            first_id = worker_id_of(paths, paused.pid)
            assert first_id is not None
            os.kill(paused.pid, signal.SIGSTOP)
            wait_until(lambda: not paths.claims(first_id).exists(), 60, "its claims to be taken over")
            filler = fill_disk(disk)
            os.kill(paused.pid, signal.SIGCONT)
            wait_until(lambda: "lost its lease" in log.read_text(errors="replace"), 30, "the worker to notice")
            time.sleep(3)   # the spool stays full meanwhile: its re-registration cannot write a byte
            assert paused.poll() is None, f"it waits for room instead of exiting:\n{log.read_text(errors='replace')[-3000:]}"
            filler.unlink()
            filler = None
            wait_until(lambda: bool(running_incarnations(paths, paused.pid)), 60, "its new incarnation")
            wait_drained(paths, timeout=180)
        finally:
            if filler is not None:
                filler.unlink()
            if paused.poll() is None:
                os.kill(paused.pid, signal.SIGCONT)
            codes = [stop_worker(steady), stop_worker(paused)]
        assert codes == [0, 0], f"{codes}\n{log.read_text(errors='replace')[-3000:]}"
        counts = Counter(row["job_id"] for row in rows(paths))
        assert len(counts) == submitted.jobs and max(counts.values()) == 1


def test_a_worker_started_on_a_full_spool_says_so_and_claims_nothing(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", 8) as disk:
        paths = make_run(disk / "run", **SETTINGS)
        submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {}}] * 4))
        queued = sorted(p.name for p in paths.init_queue.iterdir())
        filler = fill_disk(disk)
        try:
            done = subprocess.run([sys.executable, "-m", "orchestrator.worker", str(paths.root)],
                                  capture_output=True, text=True, timeout=120)
        finally:
            filler.unlink()
        assert done.returncode == 1
        assert "Traceback" not in done.stderr, done.stderr
        assert "No space left on device" in done.stderr and str(disk) in done.stderr, done.stderr
        assert "df -h" in done.stderr, "it says how to see what fills the filesystem"
        assert sorted(p.name for p in paths.init_queue.iterdir()) == queued, "nothing was claimed"
