"""Worker heartbeats: workers/W.json is rewritten every few seconds; that change is the lease.

The spool's heartbeats are the truth about which worker is alive, on every node and under any
scheduler: Slurm's own view can lag or be missing (no accounting), the spool cannot.

A worker is judged dead by a judge that saw its heartbeat file stay the same (inode, mtime,
size: an identity, never compared with a clock) for a whole lease on the judge's own monotonic
clock (spool/lease.py, `Sightings`): a node whose clock runs fast or slow is judged like any
other. What the clocks say is still worth showing: a heartbeat carries its writer's time
(`heartbeat_at`), the file's mtime is the filesystem's time of the same write, and their
difference is the writer's clock skew, which `status` reports.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.lease import Sightings
from orchestrator.spool.paths import SpoolPaths

SLURM_FIELDS = {
    "slurm_job_id": "SLURM_JOB_ID",
    "slurm_array_job_id": "SLURM_ARRAY_JOB_ID",
    "slurm_array_task_id": "SLURM_ARRAY_TASK_ID",
    "slurm_restart_count": "SLURM_RESTART_COUNT",
    "slurm_partition": "SLURM_JOB_PARTITION",
}
# A writer's clock this far from the filesystem's is reported (NTP keeps clocks within
# milliseconds; a heartbeat write takes far less than this even on a busy filesystem).
SKEW_REPORT_S = 2.0


def slurm_ids() -> dict[str, str]:
    return {key: os.environ[var] for key, var in SLURM_FIELDS.items() if var in os.environ}


def write_heartbeat(paths: SpoolPaths, worker_id: str, info: dict[str, Any]) -> None:
    record = {**info, "worker_id": worker_id, "heartbeat_at": time.time()}
    # Not flushed: a heartbeat is rewritten every few seconds, and a stale one only delays recovery.
    fsops.write_atomic(paths.heartbeat(worker_id), orjson.dumps(record, default=str), paths.tmp, fsops.Durability.NONE)


def base_info(node: str, launch_id: str) -> dict[str, Any]:
    return {
        "host": socket.gethostname(), "node": node, "pid": os.getpid(),
        "started_at": time.time(), "launch_id": launch_id, **slurm_ids(),
    }


def heartbeat_key(paths: SpoolPaths, worker_id: str) -> str:
    """What a judge's Sightings remember a worker's heartbeat under: its path."""
    return str(paths.heartbeat(worker_id))


def clock_skew(info: dict[str, Any], mtime: float) -> float | None:
    """How far the writer's clock was ahead of the filesystem's (negative: behind) at its last beat."""
    written = info.get("heartbeat_at")
    if not isinstance(written, (int, float)) or isinstance(written, bool):
        return None
    return float(written) - mtime


@dataclass(frozen=True)
class WorkerRecord:
    worker_id: str
    info: dict[str, Any]
    age_s: float            # this reader's clock minus the heartbeat's mtime: for display only
    alive: bool
    skew_s: float | None = None   # the writer's clock minus the filesystem's (clock_skew)

    @property
    def node(self) -> str:
        return str(self.info.get("node", ""))

    @property
    def skewed(self) -> bool:
        return self.skew_s is not None and abs(self.skew_s) >= SKEW_REPORT_S


def read_workers(paths: SpoolPaths, lease_s: float, sightings: Sightings | None = None) -> list[WorkerRecord]:
    """Every worker with a heartbeat file (gone workers are under workers/gone/).

    With `sightings` (a judge that acts on it: recovery), `alive` means the heartbeat changed
    within a lease as that judge saw it. Without (a one-shot reader: `status`, `launch stop`),
    it is the reader's view, the file's age on this node's clock: shown, never acted on."""
    now = time.time()
    records = []
    for name in sorted(fsops.list_names(paths.workers)):
        if not name.endswith(".json"):
            continue
        path = paths.workers / name
        identity = fsops.identity(path)
        if identity is None:
            continue
        try:
            info = orjson.loads(fsops.read_bytes(path))
        except (OSError, orjson.JSONDecodeError):
            info = {}
        info = info if isinstance(info, dict) else {}
        worker_id, mtime = name[:-5], identity[1] / 1e9
        age = now - mtime
        alive = age < lease_s if sightings is None else not sightings.silent(heartbeat_key(paths, worker_id), identity, lease_s)
        records.append(WorkerRecord(worker_id, info, age, alive, clock_skew(info, mtime)))
    return records


def retire(paths: SpoolPaths, worker_id: str) -> None:
    """Move a heartbeat to workers/gone/ (kept for `status`, out of the live set)."""
    gone = paths.workers / "gone"
    fsops.create_dirs(gone)
    fsops.rename(paths.heartbeat(worker_id), gone / f"{worker_id}.json")


def mark_fenced(paths: SpoolPaths, worker_id: str) -> None:
    """This worker found its claims taken over while it was alive: the attempts it lost are not
    the jobs' fault (recovery does not charge them, see recovery.py `_count_loss`)."""
    mark = paths.fence_mark(worker_id)
    fsops.ensure_dir(mark.parent)
    fsops.create_exclusive(mark, f"{time.time():.3f}\n".encode())


def was_fenced(paths: SpoolPaths, worker_id: str) -> bool:
    return fsops.mtime(paths.fence_mark(worker_id)) is not None
