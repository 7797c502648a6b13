"""Opening a file that someone else may have planted: no link followed, no FIFO waited on.

Spool directories are shared, so what sits under a file's name may be a symbolic link (to
/dev/zero, to another run's ticket, to a host file), a FIFO (an open() that never returns), a
device or a directory. A file is opened with O_NOFOLLOW | O_NONBLOCK and judged on the open
descriptor (fstat: exactly what will be read, whatever is renamed meanwhile), and a read never
takes more than its caller's bound. Used by orchestrator/spool/fsops.py (which counts each open)
and by run.toml's loader, below the spool layer.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from orchestrator.errors import HpcRolloutError

# What one read may bring into memory. Control files (heartbeats, requests, registries, boards,
# lock tokens) are small; tickets, batches and journals carry stage outputs (whole trajectories).
READ_LIMIT = 64 << 20
TICKET_READ_LIMIT = 2 << 30
# O_NOFOLLOW: a planted link is never followed (to /dev/zero, another run's ticket, a host file);
# O_NONBLOCK: a planted FIFO opens at once instead of waiting for a writer that never comes.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


class UnsafeSpoolFile(HpcRolloutError, OSError):
    """A spool path that is not a plain regular file, or is larger than its reader allows: it is
    never read (planted, or damaged); callers that act on files move it to quarantine/."""


def kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: Path) -> tuple[int, os.stat_result]:
    """A read-only descriptor of `path` and its attributes: UnsafeSpoolFile unless it is a
    regular file reached without following a symbolic link (FileNotFoundError when it is gone)."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeSpoolFile(f"{path} is a symbolic link (spool files are never followed)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeSpoolFile(f"{path} is {kind_of(st.st_mode)}, not a regular file")
    return fd, st


def read_open(fd: int, st: os.stat_result, path: Path, limit: int = READ_LIMIT) -> bytes:
    """The content of a file opened by open_regular, at most `limit` bytes (UnsafeSpoolFile beyond:
    a file still growing past it, or a sparse giant, is not pulled into memory)."""
    if st.st_size > limit:
        raise UnsafeSpoolFile(f"{path} holds {st.st_size} bytes, more than the {limit} a spool read takes")
    chunks, size = [], 0
    while size <= limit:
        chunk = os.read(fd, min(limit + 1 - size, 1 << 24) or 1)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise UnsafeSpoolFile(f"{path} grew past the {limit} bytes a spool read takes")
    return b"".join(chunks)


def read_regular(path: Path, limit: int = READ_LIMIT) -> bytes:
    """The content of the regular file `path`, at most `limit` bytes."""
    fd, st = open_regular(path)
    try:
        return read_open(fd, st, path, limit)
    finally:
        os.close(fd)
