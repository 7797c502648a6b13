"""The file-system primitives the spool is built on, with a count of metadata operations.

Only operations that are atomic on local disks, NFS and Lustre are used for state changes:
rename (claims, transitions), exclusive create (leases, locks) and link. Never flock/fcntl.

Metadata servers are the shared resource of a cluster, so every create, rename, unlink, stat,
open and directory listing the engine makes goes through here and is counted; the overhead
benchmark reports the count per job.
"""

from __future__ import annotations

import os
import secrets
from collections import Counter
from pathlib import Path

# Process-wide count of metadata operations by kind (create, rename, unlink, stat, open, list, mkdir).
OPS: Counter[str] = Counter()


def count(kind: str, n: int = 1) -> None:
    OPS[kind] += n


def write_atomic(path: Path, data: bytes, tmp_dir: Path) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one.

    `tmp_dir` must be on the same filesystem as `path` (the run's tmp/ directory).
    """
    tmp = tmp_dir / f".{path.name}.{secrets.token_hex(4)}"
    write_new(tmp, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    count("rename")


def write_new(path: Path, data: bytes) -> None:
    """Create `path` (it must not exist) and write `data` to it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    count("create")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def create_exclusive(path: Path, data: bytes = b"") -> bool:
    """Create `path` only if it does not exist yet; True when this call created it."""
    try:
        write_new(path, data)
    except FileExistsError:
        return False
    return True


def read_bytes(path: Path) -> bytes:
    count("open")
    with open(path, "rb") as handle:
        return handle.read()


def rename(source: Path, target: Path) -> bool:
    """Atomically move `source` to `target`; False when `source` is gone (somebody else won)."""
    count("rename")
    try:
        os.rename(source, target)
    except FileNotFoundError:
        return False
    return True


def replace(source: Path, target: Path) -> None:
    count("rename")
    os.replace(source, target)


def unlink(path: Path) -> bool:
    count("unlink")
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def list_names(directory: Path) -> list[str]:
    """Visible entries of `directory` (names starting with '.' are in-flight temporaries)."""
    count("list")
    try:
        return [name for name in os.listdir(directory) if not name.startswith(".")]
    except FileNotFoundError:
        return []


def mtime(path: Path) -> float | None:
    count("stat")
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None


def touch(path: Path) -> None:
    """Refresh `path`'s mtime (a lease heartbeat)."""
    count("stat")
    os.utime(path)


def ensure_dir(path: Path) -> None:
    count("mkdir")
    path.mkdir(parents=True, exist_ok=True)


def quarantine(path: Path, quarantine_dir: Path, reason: str) -> Path:
    """Move a corrupt file aside (never delete it) with a note saying why."""
    quarantine_dir.mkdir(parents=True, exist_ok=True)
    target = quarantine_dir / f"{path.name}.{secrets.token_hex(3)}"
    os.rename(path, target)
    count("rename")
    (quarantine_dir / f"{target.name}.reason").write_text(reason + "\n")
    count("create")
    return target
