"""A lock file on the shared filesystem: exclusive create, never flock (it does not cross nodes).

A lock left by a crashed holder is broken once it is older than `stale_s`, so one crash does
not wedge every later writer. Breaking must not become a second way in: two writers that both
judge the same lock stale must not both remove it, or the second removes the first one's fresh
lock and both write (a lost update). So a stale lock is removed only under a short-lived breaker
lock (`NAME.break`, also an exclusive create), and only if it is still the very file (inode and
mtime) that was judged stale. Acquiring stays a plain exclusive create.

The holder writes a token of its own in the lock and removes the lock at release only if it still
holds that token: a holder paused past `stale_s` (SIGSTOP, a swapped-out node) must not remove the
lock another process took after breaking its own (an inode can be reused, a token is not).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import HpcRolloutError
from orchestrator.spool import fsops

log = logging.getLogger(__name__)

FIRST_POLL_S = 0.005
MAX_POLL_S = 0.1


class LockTimeout(HpcRolloutError, TimeoutError):
    """The lock stayed held for the whole timeout."""


@dataclass
class SoftLock:
    """A held lock file; `release()` removes it if it is still ours."""

    path: Path
    token: bytes   # what this holder wrote in the lock file

    def release(self) -> None:
        try:
            if fsops.read_bytes(self.path) == self.token:
                fsops.unlink(self.path)   # (a pause exactly between the read and the unlink stays a window)
        except FileNotFoundError:
            pass  # broken as stale meanwhile: the holder took far longer than stale_s


def acquire_soft_lock(path: Path, timeout_s: float, stale_s: float) -> SoftLock:
    """Hold `path` (created exclusively); raises LockTimeout after `timeout_s`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    delay = FIRST_POLL_S
    while True:
        held = _try_create(path)
        if held is not None:
            return held
        _break_if_stale(path, stale_s)
        if time.monotonic() >= deadline:
            raise LockTimeout(f"{path} stayed locked for {timeout_s:g} s: retry, or remove it if no process holds it")
        time.sleep(delay)
        delay = min(delay * 2, MAX_POLL_S)


def try_soft_lock(path: Path) -> SoftLock | None:
    """Hold `path` if nobody does (one exclusive create, no wait); None when it is held."""
    return _try_create(path)


def _try_create(path: Path) -> SoftLock | None:
    note = f"{socket.gethostname()} pid {os.getpid()} at {time.time():.3f} {secrets.token_hex(8)}\n".encode()
    if not fsops.create_exclusive(path, note):
        return None
    return SoftLock(path, note)


def break_if_stale(path: Path, stale_s: float) -> None:
    """Remove `path` if it is older than `stale_s` (a crashed holder's), under the breaker lock."""
    _break_if_stale(path, stale_s)


def _break_if_stale(path: Path, stale_s: float) -> None:
    try:
        judged = path.stat()
    except FileNotFoundError:
        return
    if time.time() - judged.st_mtime <= stale_s:
        return
    breaker = path.with_name(path.name + ".break")
    if not fsops.create_exclusive(breaker):
        _remove_if_stale(breaker, stale_s)  # only a breaker that crashed mid-break lives this long
        return
    try:
        current = path.stat()
        if _identity(current) == _identity(judged) and current.st_mtime == judged.st_mtime:
            log.warning("removing stale lock %s (%.0f s old)", path, time.time() - judged.st_mtime)
            fsops.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        fsops.unlink(breaker)


def _remove_if_stale(path: Path, stale_s: float) -> None:
    try:
        if time.time() - path.stat().st_mtime > stale_s:
            fsops.unlink(path)
    except FileNotFoundError:
        pass


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino
