"""`launch --idle-exit` on the real cluster: drained workers give their nodes back, tasks end COMPLETED."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import orjson
import pytest

from orchestrator.submission.submit import submit_file
from tests.core.util import wait_until, write_jsonl
from tests.slurm.conftest import JobJanitor
from tests.slurm.util import SLURM_RUN, events, exactly_once, launch, logs_containing, queued, sleep_run, wait_rows

pytestmark = pytest.mark.slurm

IDLE_EXIT_S = 6.0
LOADED_MACHINE_SLACK_S = 3.0   # a busy 2-core machine delays polls and commits


def sacct_records(array: str) -> list[tuple[str, str]]:
    """Every record of the array's tasks, requeued runs included (-D)."""
    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State", "-j", array],
                         capture_output=True, text=True, timeout=30).stdout
    return [tuple(line.split("|", 1)) for line in out.split()]  # type: ignore[misc]


@pytest.mark.slurm(nodes=2, accounting=True)
def test_idle_workers_exit_completed_without_requeue_and_a_late_job_still_runs(run_root: Path, janitor: JobJanitor) -> None:
    paths = sleep_run(run_root, jobs=16, run_s=0.5)
    array, _ = launch(paths, "--nodes", "2", "--idle-exit", str(IDLE_EXIT_S))
    janitor.add(array)
    exactly_once(wait_rows(paths, 16, timeout=180), 16)

    # A job submitted shortly before the last worker's idle window runs out is still run.
    last_finish = max(e["t"] for e in events(paths, "finished"))
    time.sleep(max(0.0, last_finish + IDLE_EXIT_S - 2.0 - time.time()))
    late = submit_file(paths, write_jsonl(run_root.parent / "late.jsonl", [{"handler": "sleep", "instance": {"run": 0.2}}]))
    assert not events(paths, "idle_exit") or len(events(paths, "idle_exit")) < 2, "both workers left before the deadline"
    table = wait_rows(paths, 17, timeout=120)
    exactly_once(table, 17)
    assert late.first_job in table["job_id"]

    # Every worker leaves by itself within its idle window plus a heartbeat; the tasks leave squeue.
    wait_until(lambda: not queued(array), 120, "the idle tasks to leave squeue")
    left = events(paths, "idle_exit")
    assert len(left) == 2, left
    for exit_event in left:
        worker = exit_event["worker"]
        busy_until = max(e["t"] for e in events(paths, "finished") + events(paths, "worker_started") if e["worker"] == worker)
        assert exit_event["t"] - busy_until <= IDLE_EXIT_S + SLURM_RUN["leases.heartbeat_s"] + LOADED_MACHINE_SLACK_S
        assert exit_event["t"] - busy_until >= IDLE_EXIT_S
    stopped = events(paths, "worker_stopped")
    assert {e["state"] for e in stopped} == {"stopped"} and len(stopped) == 2
    gone = [orjson.loads(p.read_bytes()) for p in (paths.workers / "gone").glob("*.json")]
    assert {b.get("slurm_restart_count", "0") for b in gone} == {"0"}, "an idle exit must never requeue"

    # Accounting: exactly one record per task, COMPLETED (no REQUEUED, no second run).
    wait_until(lambda: len(sacct_records(array)) == 2 and all(s == "COMPLETED" for _, s in sacct_records(array)),
               60, f"sacct to show both tasks COMPLETED: {sacct_records(array)}")
    assert not logs_containing(paths, "Requeued"), "submitit's checkpoint/requeue path ran"
    assert not logs_containing(paths, "checkpoint")
    assert len({p.name for p in logs_containing(paths, "Job completed successfully")}) == 2   # logs/latest links one twice
