"""One node worker on Slurm, however it was submitted: `launch --nodes` (submitit) and a rendered
`sbatch render worker` script run the same entry point, and the warning signal (preemption, time
limit) has the same outcome on both: the signalled task gives its claims back at once, says so
in its log, requeues itself, and serves again; every job ends exactly once."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.slurm.templates import render
from orchestrator.spool.paths import SpoolPaths
from tests.core.util import cli, wait_until
from tests.slurm.conftest import JobJanitor
from tests.slurm.util import events, exactly_once, heartbeats, launch, queued, sleep_run, wait_rows

pytestmark = pytest.mark.slurm(nodes=2, accounting=True)

SOURCE = Path(__file__).parents[2]
JOBS = 80   # 1 s of RUN each on 2 x 2 slots: work is left when the signalled task comes back


@dataclass(frozen=True)
class Outcome:
    signal_events: tuple[str, ...]   # what the signalled worker recorded as the reason it stopped
    claims_returned: bool            # it gave claims back at once (not through its lease)
    logged: bool                     # its task log names the signal and the requeue
    restarted: bool                  # the same array task ran again, restart count 1, and served
    requeued: bool                   # Slurm's accounting shows the task REQUEUED
    exactly_once: bool


SAME_OUTCOME = Outcome(("SIGUSR2",), True, True, True, True, True)


def submit_by_launch(paths: SpoolPaths, tmp_path: Path) -> tuple[str, str]:
    """(array id, scancel arguments that deliver the warning as Slurm would: to the task's step)."""
    array, _ = launch(paths, "--nodes", "2", "--init-pool", "2", "--run-pool", "2", "--eval-pool", "2")
    return array, ""


def submit_by_template(paths: SpoolPaths, tmp_path: Path) -> tuple[str, str]:
    """(array id, scancel arguments: `--signal=B:...` warns the batch shell only)."""
    script = tmp_path / "worker.sbatch"
    script.write_text(render("worker", {
        "run_dir": str(paths.root), "nodes": "2", "time": "00:20:00", "python": shlex.quote(sys.executable),
        "run_pool": "2", "init_pool": "2", "eval_pool": "2",
        "setup": [f"export PYTHONPATH={shlex.quote(str(SOURCE))}"],
    }))
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    return out.stdout.strip().split(";")[0], "--batch"


def task_logs(paths: SpoolPaths) -> str:
    return "".join(p.read_text(errors="replace") for p in paths.logs.rglob("*") if p.suffix in (".out", ".err"))


def sacct_states(task: str) -> list[str]:
    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "State", "-j", task],
                         capture_output=True, text=True, timeout=30).stdout
    return out.split()


@pytest.mark.parametrize("submit", [submit_by_launch, submit_by_template], ids=["launch", "sbatch-template"])
def test_the_warning_signal_has_the_same_outcome_on_both_paths(submit: object, run_root: Path, tmp_path: Path,
                                                               janitor: JobJanitor) -> None:
    paths = sleep_run(run_root, jobs=JOBS, run_s=1.0)
    array, scancel_scope = submit(paths, tmp_path)  # type: ignore[operator]
    janitor.add(array)
    task = f"{array}_0"
    wait_until(lambda: len(events(paths, "finished")) >= 8, 180, "8 finished jobs")
    signalled = next(b["worker_id"] for b in heartbeats(paths) if b.get("slurm_array_task_id") == "0")
    subprocess.run(["scancel", *([scancel_scope] if scancel_scope else []), "--signal=USR2", task],
                   check=True, timeout=30)

    wait_until(lambda: any(int(b.get("slurm_restart_count", 0)) >= 1 and b.get("state") == "running"
                           and b.get("slurm_array_task_id") == "0" for b in heartbeats(paths)), 180,
               "the signalled task to serve again")
    table = wait_rows(paths, JOBS)
    wait_until(lambda: "REQUEUED" in sacct_states(task), 60, "sacct to record the requeue")
    outcome = Outcome(
        signal_events=tuple(e["signal"] for e in events(paths, "signal") if e["worker"] == signalled),
        claims_returned=any(e["worker"] == signalled for e in events(paths, "returned")),
        logged=f"warning signal USR2: claims returned, requeueing {task}" in task_logs(paths),
        restarted=any(int(b.get("slurm_restart_count", 0)) == 1 and b.get("slurm_array_task_id") == "0"
                      and b.get("slurm_array_job_id") == array for b in heartbeats(paths)),
        requeued="REQUEUED" in sacct_states(task),
        exactly_once=_exactly_once(table),
    )
    assert outcome == SAME_OUTCOME
    cli("stop", str(paths.root), "--cancel")
    assert queued(array) == []


def _exactly_once(table: dict[str, list[object]]) -> bool:
    try:
        exactly_once(table, JOBS)
    except AssertionError:
        return False
    return True
