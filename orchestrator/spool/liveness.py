"""Worker heartbeats: workers/W.json is rewritten every few seconds; its mtime is the lease.

The spool's heartbeats are the truth about which worker is alive, on every node and under any
scheduler: Slurm's own view can lag or be missing (no accounting), the spool cannot.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths

SLURM_FIELDS = {
    "slurm_job_id": "SLURM_JOB_ID",
    "slurm_array_job_id": "SLURM_ARRAY_JOB_ID",
    "slurm_array_task_id": "SLURM_ARRAY_TASK_ID",
    "slurm_restart_count": "SLURM_RESTART_COUNT",
    "slurm_partition": "SLURM_JOB_PARTITION",
}


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


@dataclass(frozen=True)
class WorkerRecord:
    worker_id: str
    info: dict[str, Any]
    age_s: float            # seconds since the last heartbeat
    alive: bool

    @property
    def node(self) -> str:
        return str(self.info.get("node", ""))


def read_workers(paths: SpoolPaths, lease_s: float) -> list[WorkerRecord]:
    """Every worker with a heartbeat file (gone workers are under workers/gone/)."""
    now = time.time()
    records = []
    for name in sorted(fsops.list_names(paths.workers)):
        if not name.endswith(".json"):
            continue
        path = paths.workers / name
        mtime = fsops.mtime(path)
        if mtime is None:
            continue
        try:
            info = orjson.loads(fsops.read_bytes(path))
        except (OSError, orjson.JSONDecodeError):
            info = {}
        age = now - mtime
        records.append(WorkerRecord(name[:-5], info, age, age < lease_s))
    return records


def is_alive(paths: SpoolPaths, worker_id: str, lease_s: float) -> bool:
    mtime = fsops.mtime(paths.heartbeat(worker_id))
    return mtime is not None and time.time() - mtime < lease_s


def retire(paths: SpoolPaths, worker_id: str) -> None:
    """Move a heartbeat to workers/gone/ (kept for `status`, out of the live set)."""
    gone = paths.workers / "gone"
    fsops.create_dirs(gone)
    fsops.rename(paths.heartbeat(worker_id), gone / f"{worker_id}.json")
