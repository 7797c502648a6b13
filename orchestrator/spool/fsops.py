"""The file-system primitives the spool is built on, with a count of metadata operations.

Only operations that are atomic on local disks, NFS and Lustre are used for state changes:
rename (claims, transitions), exclusive create (leases, locks) and link. Never flock/fcntl.

Metadata servers are the shared resource of a cluster, so every create, rename, unlink, stat,
open and directory listing the engine makes goes through here and is counted; the overhead
benchmark reports the count per job. So are the flushes that make a state survive a node
crash (fsync of a file, of a directory, syncfs of the spool): see Durability.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import dataclasses
import enum
import errno
import os
import secrets
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from orchestrator import safe_open
from orchestrator.errors import HpcRolloutError

# Process-wide count of metadata operations by kind (create, rename, unlink, stat, open, list,
# mkdir) and of flushes (fsync, fsync_dir, syncfs).
OPS: Counter[str] = Counter()
# Names returned by directory listings: a listing is one operation, but a metadata server sends a
# large directory in several replies (the scale model, docs/scale.md, charges one per 1,000 names).
LISTED: Counter[str] = Counter()
# The same operations by the duty that made them (a job's own steps, heartbeats, polls...):
# the scale model (benchmarks/scale.py) charges per-job work per job and periodic duties per
# second, without counting anything twice. Listed names are charged as "<duty>:names".
BY_DUTY: Counter[str] = Counter()
# Data flushes of files already open (journal appends): they go to the data servers (Lustre
# OSTs, GPFS NSDs), not to the metadata server, so they are counted apart from OPS and charged
# as "<duty>:data" (the scale model's sums leave them out).
DATA: Counter[str] = Counter()
JOB_DUTY = "job"
_duty: contextvars.ContextVar[str] = contextvars.ContextVar("fsops_duty", default=JOB_DUTY)


@dataclasses.dataclass(frozen=True)
class Modes:
    """Permission bits of what the spool creates. Explicit, so that the umask of whoever runs a
    command never widens them: owner-only unless the run is shared with a group (run.toml
    [access] group; orchestrator/spool/access.py sets them when a run is opened)."""

    file: int = 0o600
    dir: int = 0o700


_modes = Modes()


def set_modes(modes: Modes) -> None:
    global _modes
    _modes = modes


def modes() -> Modes:
    return _modes


def count(kind: str, n: int = 1) -> None:
    OPS[kind] += n
    BY_DUTY[_duty.get()] += n


def listed(names: int) -> None:
    """One directory listing that returned `names` entries."""
    count("list")
    LISTED["names"] += names
    BY_DUTY[f"{_duty.get()}:names"] += names


@contextlib.contextmanager
def duty(name: str) -> Iterator[None]:
    """Charge the operations made inside (this thread or asyncio task) to duty `name`."""
    token = _duty.set(name)
    try:
        yield
    finally:
        _duty.reset(token)


def recharge(source: str, target: str, ops: int, names: int) -> None:
    """Move operations already counted under `source` to `target` (e.g. a claim that found
    nothing is an idle poll, not part of a job)."""
    for suffix, n in (("", ops), (":names", names)):
        BY_DUTY[source + suffix] -= n
        BY_DUTY[target + suffix] += n


class Durability(enum.Enum):
    """What of a write survives a crash of the node that made it (power loss, kernel panic).

    Without a flush, a client of a shared filesystem (Lustre, NFS) or a local disk may lose
    written data while the rename that published it survives: an empty or torn file under
    its final name.
    """

    NONE = "none"   # heartbeats, load boards: rewritten every few seconds anyway
    DATA = "data"   # content flushed before the rename: never torn; the rename may be undone
    FULL = "full"   # and the directory flushed after it: the new name survives too


def write_atomic(path: Path, data: bytes, tmp_dir: Path | None = None,
                 durability: Durability = Durability.DATA, mode: int | None = None,
                 fence: Callable[[], bool] | None = None) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one.

    The one atomic-write primitive of the project (spool files, the backend registry, sandbox
    records, reports): a hidden temporary is created exclusively, then renamed over `path`.
    `tmp_dir` must be on the same filesystem as `path` (the run's tmp/ directory); by default
    the temporary sits next to `path`. `fence`, asked once the data is on disk and right before
    the rename, says whether the writer may still replace `path` (its lock is still its own);
    False removes the temporary and raises FenceLost, and `path` is left as it was.
    """
    tmp = (tmp_dir or path.parent) / f".{path.name}.{secrets.token_hex(4)}"
    write_new(tmp, data, sync=durability is not Durability.NONE, mode=mode)
    if fence is not None and not fence():
        _unlink_quietly(tmp)
        raise FenceLost(f"{path} was not replaced: the writer no longer holds its lock")
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    count("rename")
    if durability is Durability.FULL:
        sync_dir(path.parent)


def point_symlink(link: Path, target: str) -> None:
    """Make `link` a symbolic link to `target`, atomically (readers never find it missing)."""
    tmp = link.with_name(f".{link.name}.{secrets.token_hex(4)}")
    os.symlink(target, tmp)
    count("create")
    try:
        os.replace(tmp, link)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    count("rename")


def write_new(path: Path, data: bytes, sync: bool = False, mode: int | None = None) -> None:
    """Create `path` (it must not exist) and write `data` to it; with `sync`, flush it to disk.

    `mode`: the run's file mode unless given. A failed write (ENOSPC, EIO) removes the partial
    file before raising.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _modes.file if mode is None else mode)
    count("create")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
            count("fsync")
    except BaseException:
        os.close(fd)
        _unlink_quietly(path)
        raise
    os.close(fd)


def sync_file(fd: int) -> None:
    os.fsync(fd)
    count("fsync")


def append_flushed(fd: int, data: bytes) -> None:
    """Append `data` to an open file and flush its data (fdatasync): no metadata operation.

    A write that fails part-way is cut back off (ftruncate), so the file never keeps a torn
    record that a later append would glue itself to.
    """
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fdatasync(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise
    DATA["fdatasync"] += 1
    BY_DUTY[f"{_duty.get()}:data"] += 1


def sync_dir(directory: Path) -> None:
    """Flush a directory, so that names created or renamed into it survive a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    count("fsync_dir")


_libc = ctypes.CDLL(None, use_errno=True)


def sync_filesystem(path: Path) -> None:
    """Flush every written file of the filesystem holding `path` (one call for a whole batch).

    syncfs(2) where the C library has it, else sync(2).
    """
    syncfs = getattr(_libc, "syncfs", None)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)
    count("syncfs")


def create_exclusive(path: Path, data: bytes = b"", durability: Durability = Durability.NONE) -> bool:
    """Create `path` only if it does not exist yet; True when this call created it."""
    try:
        write_new(path, data, sync=durability is not Durability.NONE)
    except FileExistsError:
        return False
    if durability is Durability.FULL:
        sync_dir(path.parent)
    return True


# Spool reads are bounded (orchestrator/safe_open.py): control files, and tickets with their outputs.
READ_LIMIT = safe_open.READ_LIMIT
TICKET_READ_LIMIT = safe_open.TICKET_READ_LIMIT
UnsafeSpoolFile = safe_open.UnsafeSpoolFile


class FenceLost(HpcRolloutError):
    """An atomic write's fence said no: the writer lost its lock while it wrote (it was paused
    past the lock's staleness and a peer took over). Its change must be made again, under the lock."""
kind_of = safe_open.kind_of
read_open = safe_open.read_open


def open_regular(path: Path) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file `path` and its attributes, checked on the
    descriptor (orchestrator/safe_open.py): the one way spool files are opened for reading
    (tests/core/test_spool_reads.py holds the package to it)."""
    count("open")
    return safe_open.open_regular(path)


def read_regular(path: Path, limit: int = READ_LIMIT) -> tuple[bytes, os.stat_result]:
    """The content of the regular file `path` and the attributes of exactly what was read."""
    fd, st = open_regular(path)
    try:
        return read_open(fd, st, path, limit), st
    finally:
        os.close(fd)


def read_bytes(path: Path, limit: int = READ_LIMIT) -> bytes:
    """The content of the regular file `path` (UnsafeSpoolFile for a link, FIFO, device or
    directory, or beyond `limit`; FileNotFoundError when it is gone)."""
    return read_regular(path, limit)[0]


def open_append(path: Path) -> int:
    """A descriptor appending to `path` (created with the run's file mode when missing); a planted
    link or FIFO there is refused (UnsafeSpoolFile), never written through or waited on."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     _modes.file)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):   # ENXIO: a FIFO nobody reads
            raise UnsafeSpoolFile(f"{path} is {'a symbolic link' if exc.errno == errno.ELOOP else 'a FIFO'}, "
                                  "not a file to append to") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnsafeSpoolFile(f"{path} is {kind_of(mode)}, not a file to append to")
    return fd


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
    return [name for name in list_all_names(directory) if not name.startswith(".")]


def list_all_names(directory: Path) -> list[str]:
    """Every entry of `directory`, hidden ones included (one listing); [] when it is gone."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        names = []
    listed(len(names))
    return names


def has_entries(directory: Path) -> bool:
    """Whether a directory holds anything: one listing that stops at its first name, however
    large the directory (a metadata server sends its first reply only)."""
    count("list")
    try:
        with os.scandir(directory) as entries:
            return any(not entry.name.startswith(".") for entry in entries)
    except FileNotFoundError:
        return False


def mtime(path: Path) -> float | None:
    count("stat")
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None


def refresh_dir(directory: Path) -> None:
    """Open and close `directory` (one metadata operation): an NFS client with close-to-open
    consistency (the default) revalidates a directory's cached attributes when it is opened, and
    once it finds the directory changed it drops the "does not exist" answers it cached for names
    in it. So a name another node created since (control/stop, the next shard of a writer) is
    found by the next lookup, instead of after the directory's attribute cache time (acdirmin,
    30 s by default); docs/robustness.md, shared filesystems."""
    count("open")
    try:
        os.close(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    except FileNotFoundError:
        pass


def identity(path: Path) -> tuple[int, int, int] | None:
    """(inode, mtime in ns, size) of `path`, None when it is gone: what says a file changed.

    Compared only with an earlier identity of the same file, never with a clock (spool/lease.py)."""
    count("stat")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def make_dir(path: Path) -> None:
    """Create the directory `path` (it must not exist)."""
    count("mkdir")
    os.mkdir(path, _modes.dir)


def rename_dir(source: Path, target: Path) -> bool:
    """Rename the directory `source` to `target`; False when `target` is a non-empty directory
    (or not a directory): the rename that takes a lock (spool/lease.py)."""
    count("rename")
    try:
        os.rename(source, target)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            return False
        raise
    return True


def remove_dir(path: Path) -> None:
    """rmdir: fails (OSError ENOTEMPTY) unless the directory is empty."""
    count("unlink")
    os.rmdir(path)


def touch(path: Path) -> None:
    """Refresh `path`'s mtime (a lease heartbeat)."""
    count("stat")
    os.utime(path)


def ensure_dir(path: Path) -> None:
    count("mkdir")
    create_dirs(path)


def create_dirs(path: Path) -> None:
    """`mkdir -p` with the run's directory mode for every directory it creates, in the system
    calls Path.mkdir(parents=True, exist_ok=True) makes (not counted: callers that are part of a
    job's cost use ensure_dir)."""
    try:
        os.mkdir(path, _modes.dir)
    except FileNotFoundError:
        if path.parent == path:
            raise
        create_dirs(path.parent)
        create_dirs(path)
    except OSError:
        if not path.is_dir():
            raise


def ensure_real_dirs(base: Path, parts: tuple[str, ...], quarantine_dir: Path) -> Path:
    """`base/parts...` as real directories none of which anyone else can write, made where
    missing; what stands in the way (a planted link, a file, a directory open to others) is moved
    to `quarantine_dir` with the reason and made afresh. Where a job's workspace goes: a link there
    would make (and later remove) it inside the link's target."""
    path = base
    for part in parts:
        path = path / part
        while True:
            try:
                make_dir(path)
                break
            except FileNotFoundError:   # the base itself is missing (a run made by hand, a test's)
                create_dirs(path.parent)
            except FileExistsError:
                count("stat")
                st = os.lstat(path)
                if stat.S_ISDIR(st.st_mode) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    break
                what = kind_of(st.st_mode) if not stat.S_ISDIR(st.st_mode) else f"a directory others may write (mode {stat.S_IMODE(st.st_mode):04o})"
                quarantine(path, quarantine_dir, f"{path} is {what} where a directory of the run goes: moved aside, never followed")
    return path


def quarantine(path: Path, quarantine_dir: Path, reason: str) -> Path:
    """Move a corrupt file (or directory) aside, never deleting it, with a note saying why."""
    create_dirs(quarantine_dir)
    target = quarantine_dir / f"{path.name}.{secrets.token_hex(3)}"
    os.rename(path, target)
    count("rename")
    write_new(quarantine_dir / f"{target.name}.reason", (reason + "\n").encode())
    return target
