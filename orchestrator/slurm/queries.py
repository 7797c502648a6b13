"""What Slurm says about our arrays: squeue first, sacct for what left the queue.

Everything here degrades: no Slurm client -> empty answers, a controller that does not answer
-> one warning. The spool's heartbeats remain the truth about liveness; Slurm's view is only
used to explain a discrepancy to a human.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

from orchestrator.slurm.cluster import run_slurm
from orchestrator.slurm.errors import SlurmClientMissing, SlurmCommandFailed, SlurmUnavailable

ACTIVE_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT"})


@dataclass(frozen=True)
class TaskState:
    task: str            # "123_4" for an array task, "125" for a plain job
    state: str           # squeue/sacct state name, e.g. RUNNING, PENDING, PREEMPTED
    reason: str = ""     # squeue's %r: why a task waits (Resources, Priority, JobArrayTaskLimit...)


def _array_of(task: str) -> str:
    return task.split("_", 1)[0]


def queued_tasks(job_ids: Iterable[str]) -> dict[str, TaskState]:
    """Tasks of these jobs/arrays still known to squeue, one entry per array task (-r)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    try:
        text = run_slurm(["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", ",".join(ids)])
    except SlurmCommandFailed as exc:
        if _every_id_left_the_queue(exc):
            return {}
        raise
    tasks = {}
    for line in text.splitlines():
        task, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if task:
            tasks[task] = TaskState(task, state, "" if reason == "None" else reason)
    return tasks


def _every_id_left_the_queue(exc: SlurmCommandFailed) -> bool:
    # squeue -j exits 1 when none of the ids is known any more. Its exit status is the same for
    # a controller error, and squeue has no structured output on every site (--json needs the
    # openapi plugin), so the one message Slurm prints for it is the only way to tell them apart.
    return exc.returncode == 1 and "Invalid job id" in exc.stderr


def accounted_states(job_ids: Iterable[str]) -> dict[str, str]:
    """Final states from sacct (needs slurmdbd); {} when accounting is unavailable."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    try:
        text = run_slurm(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(ids)])
    except SlurmUnavailable:
        return {}
    states = {}
    for line in text.splitlines():
        task, _, state = line.strip().partition("|")
        if task:
            states[task] = state.split()[0] if state else ""
    return states


def task_of(worker: dict[str, Any]) -> str | None:
    """The Slurm task a worker heartbeat belongs to: "A_i" inside an array, else the job id."""
    array, index = worker.get("slurm_array_job_id"), worker.get("slurm_array_task_id")
    if array and index is not None and str(index) != "":
        return f"{array}_{index}"
    job = worker.get("slurm_job_id")
    return str(job) if job else None


def slurm_warnings(workers: list[dict[str, Any]]) -> list[str]:
    """Human-readable warnings for workers that look alive in the spool but not in Slurm."""
    alive = [(w, task) for w in workers if w.get("alive") and (task := task_of(w))]
    if not alive:
        return []
    try:
        queued = queued_tasks(_array_of(t) for _, t in alive)
    except SlurmClientMissing:
        return []
    except SlurmUnavailable as exc:
        return [f"Slurm did not answer ({exc}); worker liveness comes from heartbeats only"]
    missing = [(w, t) for w, t in alive if t not in queued or queued[t].state not in ACTIVE_STATES]
    if not missing:
        return []
    final = accounted_states(t for _, t in missing if t not in queued)
    by_array: dict[str, list[str]] = defaultdict(list)
    for worker, task in missing:
        if task in queued:
            where = f"is {queued[task].state} in squeue"
        elif task in final:
            where = f"left the queue ({final[task]} in sacct)"
        else:
            where = "is gone from squeue (no sacct record)"
        by_array[_array_of(task)].append(
            f"worker {worker.get('worker_id')} on {worker.get('node')}: Slurm task {task} {where} "
            "but its heartbeat is recent; its claims return when the lease expires"
        )
    warnings = []
    for array, lines in sorted(by_array.items()):
        still = [t for t in queued if _array_of(t) == array]
        if not still:
            what = "array" if any(t.startswith(f"{array}_") for _, t in missing) else "job"
            warnings.append(f"{what} {array}: no task left in squeue while {len(lines)} worker(s) look alive")
        warnings += lines
    return warnings


def cancel(job_ids: Iterable[str], pending_only: bool = False) -> list[str]:
    """scancel these jobs/arrays (only ids we launched); returns the ids asked for."""
    ids = sorted(set(job_ids))
    if not ids:
        return []
    args = ["scancel", *(["--state=PENDING"] if pending_only else []), *ids]
    try:
        run_slurm(args)
    except SlurmClientMissing:
        raise
    except SlurmUnavailable:
        pass  # some ids may be finished already: scancel complains but cancels the rest
    return ids


def still_queued(job_ids: Iterable[str]) -> list[str]:
    try:
        return sorted(queued_tasks(job_ids))
    except SlurmUnavailable:
        return []


__all__ = ["TaskState", "accounted_states", "cancel", "queued_tasks", "slurm_warnings", "still_queued", "task_of"]
