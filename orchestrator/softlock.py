"""A lock file on the shared filesystem: exclusive create (filelock's SoftFileLock), never flock.

A lock left by a crashed holder is broken once it is older than `stale_s`, so one crash does
not wedge every later writer.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from filelock import SoftFileLock, Timeout

log = logging.getLogger(__name__)


class LockTimeout(TimeoutError):
    """The lock stayed held for the whole timeout."""


def acquire_soft_lock(path: Path, timeout_s: float, stale_s: float) -> SoftFileLock:
    """Hold `path` (created exclusively); raises LockTimeout after `timeout_s`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        age = time.time() - path.stat().st_mtime
        if age > stale_s:
            log.warning("removing stale lock %s (%.0f s old)", path, age)
            path.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
    lock = SoftFileLock(str(path), timeout=timeout_s)
    try:
        lock.acquire()
    except Timeout:
        raise LockTimeout(str(path)) from None
    return lock
