"""Wake-ups when a spool directory gains an entry: Linux's inotify, a hint beside the polls.

A waiter (an idle worker's dispatcher, a trainer waiting for its step's rows) looks at its
directory every few tens of milliseconds, so half a poll passes on average between a ticket or a
shard landing and its being seen: twice in each step of a trainer that waits for its own rollouts
(submit -> a worker claims; shard -> the trainer reads). inotify tells at once, but only of changes
made through this node's kernel: on a local disk all of them, on NFS or Lustre this node's own and
never another node's. So a watch only shortens a wait: every waiter keeps its poll, and where
inotify cannot be had (not Linux, the per-user limit fs.inotify.max_user_instances reached, a
filesystem refusing watches) the watch is inert and the polls are all there is.

Hand-written over ctypes, three calls of the C library as fsops.sync_filesystem does: the
inotify_simple package finds the C library with ctypes.util.find_library, which runs `ldconfig -p`
in a subprocess in every process that makes a watch (7 ms measured), where CDLL(None) has the calls.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import struct
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

IN_MOVED_TO = 0x00000080    # a rename into the directory: how tickets and shards are published
IN_CREATE = 0x00000100      # a new name (a hard link, a file written in place)
IN_Q_OVERFLOW = 0x00004000  # events were dropped: treat every directory as changed
IN_IGNORED = 0x00008000     # the watch is gone (its directory was removed)
_EVENT = struct.Struct("iIII")   # struct inotify_event: wd, mask, cookie, len; then len bytes of name
_READ_BYTES = 64 * 1024

_libc: ctypes.CDLL | None = None


def _inotify_fd() -> int | None:
    """A non-blocking, close-on-exec inotify descriptor, or None where inotify cannot be had."""
    global _libc
    try:
        _libc = _libc or ctypes.CDLL(None, use_errno=True)
        init = _libc.inotify_init1
    except (OSError, AttributeError):   # not Linux
        return None
    fd = int(init(os.O_NONBLOCK | os.O_CLOEXEC))
    if fd < 0:
        log.debug("inotify unavailable (%s): waits poll only", os.strerror(ctypes.get_errno()))
        return None
    return fd


class DirWatch:
    """Which of some directories gained a visible entry (names starting with '.', the atomic
    writes' temporaries, are left out) since the last look."""

    def __init__(self, directories: Iterable[Path] = ()) -> None:
        self._fd = _inotify_fd()
        self._dirs: dict[int, Path] = {}
        for directory in directories:
            self.add(directory)

    @property
    def active(self) -> bool:
        """Whether any directory is watched (else waits are plain sleeps)."""
        return self._fd is not None and bool(self._dirs)

    def fileno(self) -> int | None:
        """The descriptor to wait on (readable when an event came); None when inert."""
        return self._fd if self.active else None

    def add(self, directory: Path) -> bool:
        """Watch `directory`; False when it cannot be watched (missing, refused, inert)."""
        if self._fd is None or _libc is None:
            return False
        wd = int(_libc.inotify_add_watch(self._fd, os.fsencode(directory), IN_MOVED_TO | IN_CREATE))
        if wd < 0:
            log.debug("cannot watch %s (%s): its waits poll only", directory, os.strerror(ctypes.get_errno()))
            return False
        self._dirs[wd] = directory
        return True

    def changed(self) -> set[Path]:
        """The directories that gained an entry since the last call; never blocks."""
        found: set[Path] = set()
        while self._fd is not None:
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                break
            found |= self._parse(data)
        return found

    def wait(self, timeout_s: float) -> set[Path]:
        """Block until a watched directory gains an entry or `timeout_s` passes; which gained one."""
        fd = self.fileno()
        if fd is None:
            time.sleep(max(0.0, timeout_s))
            return set()
        readable, _, _ = select.select([fd], [], [], max(0.0, timeout_s))
        return self.changed() if readable else set()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._dirs.clear()

    def __enter__(self) -> DirWatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _parse(self, data: bytes) -> set[Path]:
        found: set[Path] = set()
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
            offset += _EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                found |= set(self._dirs.values())
            elif mask & IN_IGNORED:
                self._dirs.pop(wd, None)
            elif wd in self._dirs and not name.startswith(b"."):
                found.add(self._dirs[wd])
        return found
