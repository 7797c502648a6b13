"""Reap sandboxes whose owner is gone or whose wall-clock limit has passed.

Found through the records in the node-local runtime directory (owner pid + start time,
sandbox pids + start times), never by process name: other users' and other runs'
processes with similar names are none of our business.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from orchestrator.sandbox import cgroups, loopback
from orchestrator.sandbox.process import CLOSING_MARK, kill_processes, reap_children, release_resources
from orchestrator.sandbox.procs import wait_gone
from orchestrator.sandbox.records import SandboxRecord, UntrustedRecord, sandboxes_dir, untrusted_because

log = logging.getLogger(__name__)

HALF_WRITTEN_GRACE_S = 60.0


def _reap(record: SandboxRecord, reason: str) -> None:
    log.warning("reaping sandbox %s of job %s: %s", record.id, record.job_id, reason)
    kill_processes(record)
    if not wait_gone(record.processes(), 5.0):
        log.error("sandbox %s: processes survived SIGKILL: %s", record.id, record.processes())
    release_resources(record)


def sweep_orphaned_sandboxes() -> int:
    """Reap this node's orphaned sandboxes (of this user); returns how many were reaped.

    Workers call it at start and periodically. A sandbox is reaped when its owner process
    is gone, when its wall-clock deadline has passed, or (cleanup only) when its own
    processes died without a close.
    """
    reap_children()
    reaped = 0
    live: set[str] = set()
    now = time.time()
    for directory in sorted(sandboxes_dir().iterdir()):
        try:
            record = SandboxRecord.load(directory)
        except UntrustedRecord as exc:
            if untrusted_because(directory) is not None:
                log.warning("ignoring %s: not created by this user (%s)", directory, exc)
                continue
            if (directory / "record.json").exists() or not _older_than(directory, HALF_WRITTEN_GRACE_S):
                log.warning("ignoring sandbox directory %s: %s", directory, exc)
                continue
            shutil.rmtree(directory, ignore_errors=True)  # ours, and its record was never written
            continue
        except (OSError, ValueError, TypeError):
            if _older_than(directory, HALF_WRITTEN_GRACE_S):
                shutil.rmtree(directory, ignore_errors=True)  # ours (checked), half-written long ago
            continue
        if record.process == [0, 0]:  # being started right now
            live.add(record.id)
            continue
        if not record.owner_process().alive():
            _reap(record, f"owner process {record.owner[0]} is gone")
            reaped += 1
        elif now > record.deadline:
            _reap(record, "its wall-clock limit has passed")
            reaped += 1
        elif not any(p.alive() for p in record.processes()):
            if _older_than(directory / CLOSING_MARK, HALF_WRITTEN_GRACE_S, missing=True):
                _reap(record, "its processes exited without a close")
                reaped += 1
            else:
                live.add(record.id)  # its owner is closing it right now
        else:
            live.add(record.id)
    loopback.reclaim_stale()
    for group in cgroups.stale_groups(live):
        if not cgroups.pids_in(group) and _older_than(group, HALF_WRITTEN_GRACE_S):
            cgroups.remove(group)
    return reaped


def _older_than(path: Path, seconds: float, missing: bool = False) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return missing
