"""The registry file (`backends.json`) as one reader or writer of it sees it: read and cached,
trusted or set aside, changed under the writers' lock with fenced writes.

Readers never lock: a read stats the file and parses it again only when it changed. Writers hold
`backends.json.lock` (a lock of orchestrator/spool/lease.py, portable across nodes where flock is
not) and replace the file atomically; a writer whose lock was broken while it wrote (paused past
its staleness) has its write fenced off and makes its change again. What the changes are is
orchestrator/llm/registry.py's BackendRegistry.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Self, TypeVar

from orchestrator.spool import access, fsops
from orchestrator.llm.backend_entries import Snapshot, parse_snapshot
from orchestrator.llm.errors import RegistryCorrupt, RegistryError, RegistryUntrusted
from orchestrator.llm.files import write_json_atomic
from orchestrator.llm.history import append_changes
from orchestrator.spool.fs_record import recorded_delay_s
from orchestrator.spool.lease import Lock, LockTimeout, acquire
from orchestrator.spool.paths import SpoolPaths

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 30.0
SET_ASIDE_LOCK_TIMEOUT_S = 2.0   # a reader setting an unusable registry aside does not wait long
# A registry that fails to parse is read again this long before it is set aside (readers: jobs wait
# meanwhile, as in an outage) or replaced (a writer): a read torn by a client's stale attribute
# cache heals when the cache expires (NFS acregmin 3 s); a longer delay measured by `doctor` wins.
READER_PATIENCE_S = 10.0
WRITER_PATIENCE_S = 3.0
# A registry write takes milliseconds: a lock that stayed the same this long (as a waiting writer
# saw it, spool/lease.py) belongs to a writer that died. Shorter than LOCK_TIMEOUT_S, so a
# writer waiting on a dead one's lock breaks it within its wait.
STALE_LOCK_S = 10.0
# A writer whose lock was broken while it wrote does its change again, this many times at most.
FENCED_ATTEMPTS = 5
T = TypeVar("T")


@dataclass
class RegistryFile:
    """Read `backends.json` of one run directory, and change it under the writers' lock."""

    paths: SpoolPaths
    # What vouches for the file's (inode, mtime_ns, size) without a stat (a large run's cluster
    # summary: a change is then noticed within two rebuild periods); None: stat at every read.
    vouch: Callable[[], tuple[int, int, int] | None] | None = field(default=None, repr=False)
    # Workers: a registry that cannot be used (corrupt, or written by a user the run does not
    # trust: orchestrator/spool/access.py) is moved to quarantine/ with its reason, and the hook is
    # told; it then reads as empty, so tasks wait as in an outage until `backend add` writes a new
    # one. Other readers (`backend list`, `status`) only report it. Writers always replace it.
    quarantine_unusable: bool = field(default=False, repr=False)
    on_quarantine: Callable[[str], None] | None = field(default=None, repr=False)
    _cache_key: tuple[int, int, int] | None = field(default=None, repr=False)
    _cache: Snapshot = field(default_factory=Snapshot, repr=False)
    _file: str = field(default="", init=False, repr=False)   # the path as a string: read() stats it per pick
    _unparsable: tuple[tuple[int, int, int], float] | None = field(default=None, init=False, repr=False)
    _recorded_delay_s: float | None = field(default=None, init=False, repr=False)

    @classmethod
    def of(cls, run_dir: str | os.PathLike[str] | SpoolPaths) -> Self:
        paths = run_dir if isinstance(run_dir, SpoolPaths) else SpoolPaths.of(run_dir)
        return cls(paths)

    # -- reading ------------------------------------------------------------------------
    def read(self) -> Snapshot:
        """The current registry; re-parsed only when the file changed (one stat otherwise, none
        while `vouch` says the file is the one cached)."""
        if self.vouch is not None and self._cache_key is not None and self.vouch() == self._cache_key:
            return self._cache
        if not self._file:
            self._file = str(self.paths.backends)
        fsops.count("stat")
        try:
            st = os.stat(self._file)
        except FileNotFoundError:
            self._cache_key, self._cache = None, Snapshot()
            return self._cache
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._cache_key:
            try:
                self._cache = self._parse(self.paths.backends)
            except RegistryCorrupt as exc:
                if self.quarantine_unusable and self._unusable(key, exc):
                    self._set_aside(key, str(exc))
                raise
            self._cache_key, self._unparsable = key, None
        return self._cache

    def _unusable(self, key: tuple[int, int, int], error: RegistryCorrupt) -> bool:
        """Whether the registry is to be set aside: a stranger's at once; one that fails to parse
        only once this same file has failed for `patience_s`. A client that caches attributes
        without close-to-open may show a registry another node replaced cut to the size it had
        cached, until its attribute cache expires: that read is torn, not the registry."""
        if isinstance(error, RegistryUntrusted):
            return True
        now = time.monotonic()
        if self._unparsable is None or self._unparsable[0] != key:
            self._unparsable = (key, now)
        return now - self._unparsable[1] >= self.patience_s(READER_PATIENCE_S)

    def patience_s(self, at_least: float) -> float:
        """How long a registry that fails to parse is read again before it is judged unusable:
        `at_least`, or longer where `hpc-rollout doctor` measured a longer delay (spool/fs_record.py)."""
        if self._recorded_delay_s is None:
            self._recorded_delay_s = recorded_delay_s(self.paths) or 0.0
        return max(at_least, self._recorded_delay_s + 1.0)

    def _parse(self, path: Path) -> Snapshot:
        """The registry in `path`, or RegistryCorrupt when it cannot be parsed or its owner is
        not one the run trusts (the owner of exactly the file read)."""
        data, refusal = access.read_trusted(self.paths, path, fsops.READ_LIMIT)
        if refusal:
            raise RegistryUntrusted(f"backend registry {refusal}")
        return parse_snapshot(data, path)

    def _set_aside(self, key: tuple[int, int, int], reason: str) -> None:
        """Quarantine the unusable registry, under the writers' lock and only if it is still the
        file judged (a writer may have replaced it meanwhile); a held lock means a writer is at
        work: it replaces the file itself, or the next read tries again."""
        try:
            lock = acquire(self.paths.backends_lock, SET_ASIDE_LOCK_TIMEOUT_S, STALE_LOCK_S)
        except LockTimeout:
            return
        try:
            self._set_aside_locked(key, reason)
        finally:
            lock.release()

    def _set_aside_locked(self, key: tuple[int, int, int] | None, reason: str) -> None:
        path = self.paths.backends
        try:
            st = path.stat()
            if key is not None and (st.st_ino, st.st_mtime_ns, st.st_size) != key:
                return
            kept = fsops.quarantine(path, self.paths.quarantine, f"{reason}; moved here from {path}: "
                                    f"`hpc-rollout backend add {self.paths.root} URL` writes a new registry")
        except FileNotFoundError:
            return
        self._cache_key, self._cache = None, Snapshot()
        log.warning("backend registry unusable, moved to %s: %s", kept, reason)
        if self.on_quarantine is not None:
            self.on_quarantine(f"moved to {kept}: {reason}")

    # -- writing ------------------------------------------------------------------------
    def _update(self, change: Callable[[Snapshot], tuple[Snapshot | None, T]]) -> T:
        """Read the registry under the writers' lock, apply `change` (the new snapshot, None to
        write nothing, and what to return) and write it. A writer paused past the lock's staleness
        (a stopped process, a slow fsync on a loaded node) finds its lock broken when it comes
        back: its write is fenced off and its change made again on what the peers wrote meanwhile."""
        for attempt in range(1, FENCED_ATTEMPTS + 1):
            with self._locked() as (snap, lock):
                new, result = change(snap)
                if new is None:
                    return result
                try:
                    self._write(snap, new, fence=lock.held)
                except fsops.FenceLost:
                    log.warning("registry write %d of %d fenced off: this writer lost its lock while it wrote "
                                "(paused past %.0f s?); doing the change again", attempt, FENCED_ATTEMPTS, STALE_LOCK_S)
                    continue
                return result
        raise RegistryError(
            f"could not change the backend registry {self.paths.backends}: the lock was taken from this "
            f"writer {FENCED_ATTEMPTS} times while it wrote (is the node paused or its disk stalled "
            f"for over {STALE_LOCK_S:.0f} s?); retry once it responds")

    @contextmanager
    def _locked(self) -> Iterator[tuple[Snapshot, Lock]]:
        lock_path = self.paths.backends_lock
        try:
            lock = acquire(lock_path, LOCK_TIMEOUT_S, STALE_LOCK_S)
        except LockTimeout:
            raise RegistryError(
                f"registry lock {lock_path} is held for over {LOCK_TIMEOUT_S:.0f} s: if no "
                f"`hpc-rollout backend` command is running, remove that directory and retry"
            ) from None
        try:
            try:
                current = self._read_for_writing()
            except RegistryCorrupt as exc:   # the writer replaces it: `backend add` rebuilds the registry
                self._set_aside_locked(None, str(exc))
                log.warning("starting a new backend registry: %s", exc)
                current = Snapshot()
            yield current, lock
        finally:
            lock.release()

    def _read_for_writing(self) -> Snapshot:
        """The registry a writer changes, read anew; one that fails to parse is read again for the
        writer's patience first (a read torn by a stale client must not make it start from nothing)."""
        deadline = time.monotonic() + self.patience_s(WRITER_PATIENCE_S)
        pause = 0.1
        while True:
            self._cache_key = None
            try:
                return self.read()
            except RegistryUntrusted:
                raise
            except RegistryCorrupt:
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _write(self, before: Snapshot, snapshot: Snapshot, fence: Callable[[], bool]) -> Snapshot:
        snapshot = replace(snapshot, updated_at=time.time())
        write_json_atomic(self.paths.backends, snapshot.to_json(), indent=True, durable=True, fence=fence)
        self._cache_key = None
        try:
            append_changes(self.paths, before, snapshot)
        except OSError as exc:  # the history serves reports; routing must not depend on it
            log.warning("could not append to %s: %s", self.paths.backends_history, exc)
        return snapshot
