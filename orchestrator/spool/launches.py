"""Launches as the spool records them: launch ids, logs/LAUNCH/ with its `latest` link, the stop request.

Shared by every way of starting workers (local processes, Slurm arrays), so it sits with the
spool primitives; starting processes is the application layer's (orchestrator/app/local_launch.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths, safe_name


def new_launch_id(prefix: str) -> str:
    return f"{prefix}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"


def launch_log_dir(paths: SpoolPaths, launch_id: str) -> Path:
    """logs/LAUNCH/, with logs/latest pointing at it."""
    log_dir = paths.logs / launch_id
    fsops.create_dirs(log_dir)
    latest = paths.logs / "latest"
    fsops.point_symlink(latest, launch_id)
    return log_dir


# The stop request a launcher saw before it started its workers, handed down to them: a worker
# ignores the request that stood when it was launched (a run can be launched again after a stop),
# and obeys any later one, including one made while it was still starting (`launch; stop`).
STOP_SEEN_ENV = "HPC_ROLLOUT_STOP_SEEN"
NO_STOP = "-"


def stop_seen_env(paths: SpoolPaths) -> dict[str, str]:
    """For the environment of the workers a launcher is about to start."""
    seen = fsops.identity(paths.stop_request)
    return {STOP_SEEN_ENV: NO_STOP if seen is None else ":".join(str(part) for part in seen)}


def stop_baseline(paths: SpoolPaths) -> tuple[int, int, int] | None:
    """The stop request this worker ignores: its launcher's (STOP_SEEN_ENV), else the one standing now."""
    handed = os.environ.get(STOP_SEEN_ENV, "")
    if handed == NO_STOP:
        return None
    parts = handed.split(":")
    if len(parts) == 3 and all(part.isdigit() for part in parts):
        return (int(parts[0]), int(parts[1]), int(parts[2]))
    return fsops.identity(paths.stop_request)


def request_stop(paths: SpoolPaths) -> None:
    """Ask every worker of the run, on every node, to drain and exit (control/stop)."""
    fsops.ensure_dir(paths.control)
    fsops.write_atomic(paths.stop_request, f"{time.time():.6f}\n".encode(), paths.tmp, fsops.Durability.FULL)


ARRAY_MARK_PREFIX, ARRAY_MARK_SUFFIX = "array-", ".started"


def _array_mark(paths: SpoolPaths, array_id: str) -> Path:
    return paths.control / f"{ARRAY_MARK_PREFIX}{safe_name(array_id, 'Slurm array id')}{ARRAY_MARK_SUFFIX}"


def started_arrays(paths: SpoolPaths) -> list[str]:
    """Ids of every Slurm array whose first task marked its start on this run (see array_started_at):
    the one trace a hand-submitted array leaves once its workers stopped and took their heartbeats."""
    if not paths.control.is_dir():
        return []
    return sorted(mark.name[len(ARRAY_MARK_PREFIX):-len(ARRAY_MARK_SUFFIX)]
                  for mark in paths.control.glob(f"{ARRAY_MARK_PREFIX}*{ARRAY_MARK_SUFFIX}"))


def array_started_at(paths: SpoolPaths, array_id: str) -> float:
    """When the first task of Slurm array `array_id` started on this run: the first task to ask
    records it (control/array-ID.started, created exclusively), later ones read it. A task submitted
    by hand has no launch record, and Slurm resets a requeued job's SubmitTime."""
    marker = _array_mark(paths, array_id)
    now = time.time()
    fsops.ensure_dir(paths.control)
    if fsops.create_exclusive(marker, f"{now:.6f}\n".encode()):
        return now
    try:
        return float(fsops.read_bytes(marker) or now)
    except (OSError, ValueError):
        return now

