"""Locks, leases and liveness across nodes on a shared filesystem: one algorithm.

Every lock or lease that processes on different nodes contend for (the backend registry's
writers, the cluster summary's rebuilder, the adapt controller, image builds, loopback
addresses) and every judgement that a worker is dead (its heartbeat is the lease on its claims)
uses the two pieces of this module.

Why not flock/fcntl. On NFS, flock is emulated with fcntl byte-range locks over the NLM side
protocol (v3) or the server's lock state (v4): a mount with `nolock` or `local_lock=all`
silently makes them node-local (no exclusion across nodes at all); a client that dies or is cut
off keeps its locks until the server's lease and grace periods run out; a lock held by a paused
process (SIGSTOP, a Slurm suspend, a frozen VM) is never broken. On Lustre, flock works only on
clients mounted with `-o flock` (`localflock` makes it node-local, the default `noflock` fails
with ENOSYS). What every one of them makes atomic is the namespace: mkdir, exclusive create,
rename, link, unlink, rmdir on the metadata server. So a lock here is a name, not a kernel lock.

1. Liveness by change (`Sightings`). A holder shows it is alive by changing something: a worker
   rewrites its heartbeat file (new inode and mtime), a lock holder renames its token to the
   next counter. A judge never compares a timestamp written by another node with its own
   clock (clocks differ; a node 40 s fast would find every healthy peer dead): it remembers
   what it last saw and when it first saw it, on its own monotonic clock, and judges the
   holder gone once that stayed the same for the whole lease. A judge that just started has
   seen nothing yet: it waits a full lease before it judges anyone dead. mtimes and inode
   numbers are only compared with themselves, as identities, never with a clock.

2. The lock (`try_lock`, `acquire`, `Lock`). A lock is a directory NAME holding exactly one
   token file, named after its holder and a renewal counter (`HOLDER.N`):
   - acquire: make a private directory `.NAME.HOLDER`, create the token in it, and rename the
     directory to NAME. A directory cannot be renamed onto a non-empty one (ENOTEMPTY/EEXIST on
     every POSIX filesystem, NFS and Lustre included), so exactly one contender wins; the
     others remove their private directory. A held lock costs one listing to find held; a
     free one that listing and three operations to take.
   - renew (a lease): rename the token to `HOLDER.N+1`: a change any judge sees in one listing.
     It fails once the lock was broken: the holder learns it lost the lock.
   - release: unlink its own token, then rmdir NAME. A process only ever removes a token by its
     own name, so a holder paused past the lock's staleness cannot remove the lock somebody
     took after breaking its own: its token is gone, and the rmdir fails on the new holder's
     token (the directory is not empty). A release cut between the unlink and the rmdir leaves
     an empty NAME, which the next acquire simply renames over (an empty directory may be
     replaced), and which the late rmdir can then no longer remove.
   - break: a contender that saw the same token for `stale_s` on its own clock unlinks that
     token (by its name: nothing else) and removes the directory. Two breakers unlink the same
     name (one finds it gone); neither can touch a newer holder's token. No breaker lock needed.
   Locks held for long (image builds) are renewed by a thread (`Lock.renewed`), so staleness can
   be short and a crashed holder costs the next one `stale_s`, not hours.

Node-local locks (caches under ~/.cache or /tmp of one node, the tiny model's build) use the
`filelock` package instead: on a local filesystem the kernel releases them when the holder dies.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from orchestrator.spool import fsops
from orchestrator.errors import HpcRolloutError

log = logging.getLogger(__name__)

FIRST_POLL_S = 0.005
MAX_POLL_S = 0.1
MAX_SIGHTINGS = 100_000   # a judge forgets the oldest sightings beyond this many (a bounded memory)
_UNSAFE = re.compile(r"[^A-Za-z0-9_@+-]")


class LockTimeout(HpcRolloutError, TimeoutError):
    """The lock stayed held (and never went stale) for the whole timeout."""


# -- 1. liveness by change -------------------------------------------------------------------
class Judge(Protocol):
    def silent(self, key: Hashable, signature: Hashable, lease_s: float) -> bool:
        """True when `key` showed no change (the same `signature`) for `lease_s`."""


@dataclass
class Sightings:
    """What this process last saw of each watched thing, and since when, on its own clock.

    `unchanged_for(key, signature)` is the time since this process first saw `key` with that
    signature (0 at the first sight and at every change). A key whose signature stayed the
    same for a lease belongs to a holder that stopped renewing: crashed, or paused past it.
    """

    clock: Callable[[], float] = time.monotonic
    limit: int = MAX_SIGHTINGS
    _seen: dict[Hashable, tuple[Hashable, float]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def unchanged_for(self, key: Hashable, signature: Hashable) -> float:
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen[0] != signature:
                self._seen.pop(key, None)
                self._seen[key] = (signature, now)
                if len(self._seen) > self.limit:
                    del self._seen[next(iter(self._seen))]
                return 0.0
            return now - seen[1]

    def silent(self, key: Hashable, signature: Hashable, lease_s: float) -> bool:
        """True when `key` showed no change for `lease_s` (its holder is gone)."""
        return self.unchanged_for(key, signature) >= lease_s

    def known(self, key: Hashable) -> bool:
        """Whether this process has seen `key` before (a first sight tells nothing yet)."""
        with self._lock:
            return key in self._seen

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._seen.pop(key, None)


# The sightings of this process, for judges that do not keep their own (a worker keeps one).
SIGHTINGS = Sightings()


def new_holder() -> str:
    """A name unique to this process and call: host-pid-random (safe in a file name)."""
    return _safe(f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}")


# -- 2. the lock ---------------------------------------------------------------------------------
@dataclass
class Lock:
    """A held lock (or lease): the directory `path` with this holder's token in it."""

    path: Path
    holder: str
    renewals: int = 0
    _renewer: threading.Thread | None = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def token(self) -> Path:
        return self.path / f"{_safe(self.holder)}.{self.renewals}"

    def held(self) -> bool:
        """Whether our token is still there (one stat)."""
        return fsops.mtime(self.token) is not None

    def renew(self) -> bool:
        """Show we are alive: the token moves to the next counter. False when the lock was broken."""
        current = self.token
        self.renewals += 1
        if fsops.rename(current, self.token):
            return True
        self.renewals -= 1
        return False

    def release(self) -> None:
        """Remove our token, then the lock directory if nothing else is in it."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        fsops.unlink(self.token)
        _remove_dir(self.path)

    @contextlib.contextmanager
    def renewed(self, every_s: float) -> Iterator["Lock"]:
        """Renew the lock every `every_s` from a thread while the block runs (a long hold)."""
        def renew_until_stopped() -> None:
            while not self._stop.wait(every_s):
                if not self.renew():
                    log.error("lock %s was broken while held (this process was paused past its staleness?)", self.path)
                    return
        self._renewer = threading.Thread(target=renew_until_stopped, name=f"renew-{self.path.name}", daemon=True)
        self._renewer.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._renewer.join()


@dataclass
class Lease:
    """A lock one of several standing contenders holds for long (the adapt controller): each calls
    `acquire()` every so often; the holder renews, the others take it over once it stayed the same
    for `stale_s` as each of them saw it."""

    path: Path
    holder: str
    stale_s: float
    sightings: Sightings = field(default_factory=Sightings)
    _lock: Lock | None = field(default=None, repr=False)

    def acquire(self) -> bool:
        """Hold the lease (renewing it if held already); False while another live holder has it."""
        if self._lock is not None:
            if self._lock.renew():
                return True
            self._lock = None   # broken: somebody judged us gone
        self._lock = try_lock(self.path, self.holder)
        if self._lock is None and break_if_stale(self.path, self.stale_s, self.sightings):
            self._lock = try_lock(self.path, self.holder)
        return self._lock is not None

    def renew(self) -> bool:
        """Show we are alive; False (nothing touched) when the lease is no longer ours."""
        if self._lock is None or not self._lock.renew():
            self._lock = None
            return False
        return True

    def held(self) -> bool:
        return self._lock is not None and self._lock.held()

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def current_holder(self) -> str | None:
        return holder_of(self.path)


def holder_alive(path: Path, stale_s: float, sightings: Sightings) -> bool:
    """Whether somebody holds the lock and showed a sign of life within `stale_s` (as this process saw it)."""
    try:
        tokens = _tokens(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return bool(tokens) and not sightings.silent(str(path), tuple(tokens), stale_s)


def try_lock(path: Path, holder: str | None = None, note: bytes | None = None) -> Lock | None:
    """Take the lock if it is free (None when held); never waits. The token holds `note` (by
    default the holder's name and pid): what a judge of `break_if_holder_gone` reads."""
    try:
        if _tokens(path):
            return None      # held
    except FileNotFoundError:
        pass                 # free
    except NotADirectoryError:
        return None          # a lock file of an older version: held until broken as stale
    holder = holder or new_holder()
    private = path.with_name(f".{path.name}.{_safe(holder)}")
    lock = Lock(path, holder)
    fsops.make_dir(private)
    fsops.write_new(private / lock.token.name, note if note is not None else f"{holder} pid {os.getpid()}\n".encode())
    if fsops.rename_dir(private, path):
        return lock
    fsops.unlink(private / lock.token.name)   # another contender won
    _remove_dir(private)
    return None


def acquire(path: Path, timeout_s: float, stale_s: float, holder: str | None = None,
            sightings: Sightings | None = None) -> Lock:
    """Hold the lock, waiting up to `timeout_s` and breaking a holder silent for `stale_s`.

    Raises LockTimeout. A holder is judged on this process's clock, so `stale_s` must be shorter
    than `timeout_s` for a crashed holder's lock to be broken within the wait."""
    fsops.create_dirs(path.parent)
    deadline = time.monotonic() + timeout_s
    delay = FIRST_POLL_S
    while True:
        held = try_lock(path, holder)
        if held is not None:
            return held
        break_if_stale(path, stale_s, sightings)
        if time.monotonic() >= deadline:
            raise LockTimeout(str(path))
        time.sleep(delay)
        delay = min(delay * 2, MAX_POLL_S)


def holder_of(path: Path) -> str | None:
    """Who holds the lock (None: nobody), from its token's name: one listing."""
    try:
        tokens = _tokens(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return tokens[0].rpartition(".")[0] if tokens else None


def break_if_stale(path: Path, stale_s: float, sightings: Sightings | None = None) -> bool:
    """Remove the lock if its token stayed the same for `stale_s` as this process saw it; True if
    it is gone now. One listing per call: call it while waiting, each call is a sighting."""
    sightings = sightings or SIGHTINGS
    key = str(path)
    try:
        tokens = _tokens(path)
    except NotADirectoryError:   # a lock file of an older version: judged by its identity alike
        return _break_stale_file(path, key, stale_s, sightings)
    except FileNotFoundError:
        return True
    if not sightings.silent(key, tuple(tokens), stale_s):
        return False
    log.warning("breaking the lock %s: its holder %s showed no sign of life for %.0f s", path,
                ", ".join(tokens) or "(none)", stale_s)
    for token in tokens:
        fsops.unlink(path / token)
    sightings.forget(key)
    return _remove_dir(path)


def break_if_holder_gone(path: Path, gone: Callable[[bytes], bool]) -> bool:
    """The same break, judged by the holder itself where the judge can see it (a lock in a
    node-local directory whose token names a process of this node): remove the lock when
    `gone(token content)` says its holder no longer exists. True if the lock is gone now."""
    try:
        tokens = _tokens(path)
    except FileNotFoundError:
        return True
    for token in tokens:
        try:
            content = fsops.read_bytes(path / token)
        except FileNotFoundError:
            continue
        except fsops.UnsafeSpoolFile:
            content = b""   # no token of any holder: nothing there names a live process
        if not gone(content):
            return False
        fsops.unlink(path / token)
    return _remove_dir(path)


def release_any(path: Path) -> None:
    """Remove the lock whoever holds it (its owner gives it back without its holder's name)."""
    try:
        tokens = _tokens(path)
    except FileNotFoundError:
        return
    for token in tokens:
        fsops.unlink(path / token)
    _remove_dir(path)


def _break_stale_file(path: Path, key: Hashable, stale_s: float, sightings: Sightings) -> bool:
    identity = fsops.identity(path)
    if identity is None:
        return True
    if not sightings.silent(key, identity, stale_s):
        return False
    sightings.forget(key)
    fsops.unlink(path)
    return True


def _tokens(path: Path) -> list[str]:
    """The token names in a lock directory: one listing (FileNotFoundError when there is no lock)."""
    try:
        names = os.listdir(path)
    except OSError:
        fsops.listed(0)
        raise
    fsops.listed(len(names))
    return sorted(names)


def _remove_dir(path: Path) -> bool:
    """rmdir: True when the directory is gone (False: somebody's token is in it)."""
    try:
        fsops.remove_dir(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    return True


def _safe(holder: str) -> str:
    return _UNSAFE.sub("_", holder)
