"""Issue 22 item 3: a node with a bad clock must not take the run.

The wall clock of one process is moved with tests/faults/skewed_clock/sitecustomize.py (on its
PYTHONPATH; no hook in the project's code), so the same tests fail on a version that judges a
lease by comparing its own clock with another node's file times:

- a worker 15 s or 40 s fast next to a healthy one (lease 3 s): nobody is fenced, no attempt is
  lost, every job ends `ok`, and `status` reports the skew;
- a submitter 120 s slow: `cancel --all` cancels what was submitted before it, not the slow
  submitter's later submission (its ids carry its slow clock).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from orchestrator.config import RunConfig
from orchestrator.report.status import snapshot
from orchestrator.spool.paths import SpoolPaths
from orchestrator.submission.submit import submit_file
from tests.core.util import cli, drain_with_a_worker, make_run, rows, start_worker, stop_worker, wait_drained, write_jsonl

SKEWED_CLOCK = str(Path(__file__).parent / "skewed_clock")
FAST_LEASES = {"leases.heartbeat_s": 0.3, "leases.lease_s": 3.0}


def skewed(offset_s: float) -> dict[str, str]:
    """The environment of a child process whose wall clock runs `offset_s` seconds off."""
    path = os.pathsep.join(p for p in (SKEWED_CLOCK, os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "HPC_ROLLOUT_TEST_CLOCK_OFFSET_S": str(offset_s)}


def events(paths: SpoolPaths, name: str) -> list[dict]:
    return [e for f in paths.events.glob("*.jsonl") for e in map(orjson.loads, f.read_bytes().splitlines())
            if e["event"] == name]


@pytest.mark.parametrize("fast_s", [15, 40])
def test_a_worker_with_a_fast_clock_fences_nobody_and_is_reported(tmp_path: Path, fast_s: int) -> None:
    paths = make_run(tmp_path / "run", **FAST_LEASES)
    profile = {"run": {"uniform": [0.05, 0.3]}, "seed": 3}
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 60))
    healthy = start_worker(paths, "--worker-id", "healthy-1-aaaa", "--run-pool", "4")
    fast = start_worker(paths, "--worker-id", "fast-1-bbbb", "--run-pool", "4", env=skewed(fast_s))
    try:
        wait_drained(paths, timeout=180)
        # `status` while both run (the fast worker has had a few leases' worth of scans by now)
        snap = snapshot(paths, RunConfig.load(paths.run_config), with_rows=False)
        status = cli("status", str(paths.root)).stdout
    finally:
        codes = [stop_worker(healthy), stop_worker(fast)]
    assert not events(paths, "lease_lost"), "a healthy worker was fenced"
    assert not events(paths, "requeued"), "an attempt was lost"
    assert codes == [0, 0], "a worker was fenced out (exit 3) or failed"
    got = rows(paths)
    assert len(got) == 60 and {r["status"] for r in got} == {"ok"} and {r["attempt"] for r in got} == {1}
    assert {r["worker"] for r in got} == {"healthy-1-aaaa", "fast-1-bbbb"}
    skew = {w["worker_id"]: w.get("clock_skew_s") for w in snap.workers}
    assert skew["fast-1-bbbb"] == pytest.approx(fast_s, abs=1.0) and abs(skew["healthy-1-aaaa"]) < 1.0, skew
    assert any("clock skew: worker fast-1-bbbb" in w and "ahead" in w for w in snap.warnings), snap.warnings
    assert not any("healthy-1-aaaa" in w for w in snap.warnings)
    assert "clock skew: worker fast-1-bbbb" in " ".join(status.split()), status


def test_cancel_all_cancels_what_came_before_not_a_slow_submitters_later_submission(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    before = submit_file(paths, write_jsonl(tmp_path / "before.jsonl", [{"handler": "echo", "instance": {}}] * 3))
    cli("cancel", str(paths.root), "--all")
    slow = subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "submit", str(paths.root),
         str(write_jsonl(tmp_path / "after.jsonl", [{"handler": "echo", "instance": {}}] * 3))],
        capture_output=True, text=True, timeout=120, env={**os.environ, **skewed(-120)})
    assert slow.returncode == 0, slow.stderr
    after = sorted(p.name[:-5] for p in paths.submissions.glob("*.json") if p.name[:-5] != before.submission_id)
    assert len(after) == 1 and after[0] < before.submission_id, "the slow submitter's id sorts before the cancel"
    drain_with_a_worker(paths, timeout=120)
    status = {r["job_id"]: r["status"] for r in rows(paths)}
    assert len(status) == 6
    assert {s for j, s in status.items() if j.startswith(before.submission_id)} == {"cancelled"}
    assert {s for j, s in status.items() if j.startswith(after[0])} == {"ok"}, status


def test_the_skewed_clock_hook_moves_only_the_wall_clock(tmp_path: Path) -> None:
    probe = "import time; print(time.time(), time.monotonic())"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, **skewed(100)}).stdout.split()
    here = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert 95 < float(out[0]) - float(here[0]) < 105 and abs(float(out[1]) - float(here[1])) < 5
