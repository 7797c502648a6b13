"""The backend registry: `backends.json` in the run directory, readable with `cat`.

Writers hold `backends.json.lock` (a lock of orchestrator/spool/lease.py, portable across nodes
where flock is not) and replace the file atomically; readers never lock. Format:

    {"format": 1, "policy_version": 4, "min_policy_version": 3, "updated_at": 1732230000.0,
     "backends": [{"url": "http://node17:8000/v1", "protocol": "vllm", "model": "...",
                   "tokenizer": null, "policy_version": 4, "node": "node17", "state": "up",
                   "added_at": 1732230000.0, "state_changed_at": 1732230000.0, "reason": "",
                   "logprob_mode": "raw"}]}

`min_policy_version` (optional): the oldest policy whose samples are still trained on (current
minus the trainer's max_policy_lag); jobs that sampled with an older one are cancelled.
`logprob_mode` (optional): `raw` or `processed`, what the server returns (llm/logprob_mode.py);
absent or null: the protocol's default (vLLM raw, SGLang processed).
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import urlsplit

import orjson

from orchestrator.spool import access, fsops
from orchestrator.llm.errors import RegistryCorrupt, RegistryError, RegistryUntrusted
from orchestrator.llm.files import write_json_atomic
from orchestrator.llm.history import append_changes
from orchestrator.llm.logprob_mode import LogprobMode, parse_logprob_mode, protocol_default
from orchestrator.spool.fs_record import recorded_delay_s
from orchestrator.spool.lease import Lock, LockTimeout, acquire
from orchestrator.spool.paths import SpoolPaths, current_node

log = logging.getLogger(__name__)

FORMAT = 1
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


class Protocol(str, enum.Enum):
    VLLM = "vllm"
    SGLANG = "sglang"


class BackendState(str, enum.Enum):
    UP = "up"              # takes new tasks
    DOWN = "down"          # failed; skipped, probed again later
    DRAINING = "draining"  # no new tasks nor turns; a task on it moves to an up backend at its next turn


def parse_enum(kind: type[enum.Enum], value: str, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        options = ", ".join(m.value for m in kind)
        raise RegistryError(f"{what} {value!r} is not valid: use one of {options}") from None


def normalize_url(url: str) -> str:
    """`url` without trailing slash, or RegistryError saying what a valid one looks like."""
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:   # e.g. brackets that are not an IPv6 address
        raise RegistryError(f"backend URL {url!r} cannot be read ({exc}): e.g. http://node17:8000/v1") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RegistryError(
            f"backend URL {url!r} is not an http(s) URL with a host, e.g. http://node17:8000/v1"
        )
    if parts.query or parts.fragment:
        raise RegistryError(f"backend URL {url!r} must not carry a query or fragment")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise RegistryError(f"backend URL {url!r} has a bad port: {exc}") from None
    return url.strip().rstrip("/")


def node_of(url: str) -> str:
    """The node a backend runs on, from its host name (loopback means this node)."""
    host = urlsplit(url).hostname or ""
    return current_node() if host in ("localhost", "127.0.0.1", "::1") else host.split(".")[0]


@dataclass(frozen=True)
class Backend:
    url: str
    protocol: Protocol = Protocol.VLLM
    model: str | None = None          # served model id; asked from /v1/models when None
    tokenizer: str | None = None      # local tokenizer path; defaults to `model` when a directory
    policy_version: int = 0
    node: str = ""
    state: BackendState = BackendState.UP
    added_at: float = 0.0
    state_changed_at: float = 0.0
    reason: str = ""
    logprob_mode: LogprobMode | None = None   # None: the protocol's default (see served_logprobs)

    @property
    def served_logprobs(self) -> LogprobMode:
        """The logprobs this server returns: as recorded at `backend add`, else its protocol's default."""
        return self.logprob_mode or protocol_default(self.protocol.value)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["protocol"] = self.protocol.value
        data["state"] = self.state.value
        data["logprob_mode"] = self.logprob_mode.value if self.logprob_mode else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Backend":
        return cls(
            url=str(data["url"]),
            protocol=Protocol(data.get("protocol", "vllm")),
            model=data.get("model"),
            tokenizer=data.get("tokenizer"),
            policy_version=int(data.get("policy_version", 0)),
            node=str(data.get("node", "")),
            state=BackendState(data.get("state", "up")),
            added_at=float(data.get("added_at", 0.0)),
            state_changed_at=float(data.get("state_changed_at", 0.0)),
            reason=str(data.get("reason", "")),
            logprob_mode=parse_logprob_mode(data["logprob_mode"]) if data.get("logprob_mode") else None,
        )


@dataclass(frozen=True)
class Snapshot:
    """One consistent read of the registry."""

    policy_version: int = 0
    backends: tuple[Backend, ...] = ()
    updated_at: float = 0.0
    min_policy_version: int = 0      # samples of older policies are stale (orchestrator/spool/staleness.py)

    def find(self, url: str) -> Backend | None:
        return next((b for b in self.backends if b.url == url), None)

    def usable(self) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if b.state is BackendState.UP)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": FORMAT,
            "policy_version": self.policy_version,
            "updated_at": self.updated_at,
            "backends": [b.to_json() for b in self.backends],
        }
        if self.min_policy_version:
            data["min_policy_version"] = self.min_policy_version
        return data


def parse_snapshot(raw: bytes, path: Path) -> Snapshot:
    try:
        data = orjson.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("backends"), list):
            raise ValueError("expected an object with a 'backends' list")
        if data.get("format", FORMAT) != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this version reads {FORMAT}")
        backends = tuple(Backend.from_json(b) for b in data["backends"])
        return Snapshot(int(data.get("policy_version", 0)), backends, float(data.get("updated_at", 0)),
                        int(data.get("min_policy_version", 0)))
    except (ValueError, KeyError, TypeError, RegistryError) as exc:
        raise RegistryCorrupt(
            f"backend registry {path} is corrupt ({exc}); no task is routed until it is fixed (tasks wait "
            f"as in an outage, and workers move the file to quarantine/): `hpc-rollout backend add "
            f"{path.parent} URL` writes a new one (or `backend clear {path.parent} --force`)"
        ) from exc


@dataclass
class BackendRegistry:
    """Read and change `backends.json` of one run directory."""

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
    def of(cls, run_dir: str | os.PathLike[str] | SpoolPaths) -> "BackendRegistry":
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

    def add(
        self,
        url: str,
        *,
        protocol: Protocol | str = Protocol.VLLM,
        model: str | None = None,
        tokenizer: str | None = None,
        version: int | None = None,
        node: str | None = None,
        logprob_mode: LogprobMode | str | None = None,
    ) -> Backend:
        """Add (or replace) the backend at `url`; its version defaults to the registry's.

        `logprob_mode`: what the server returns (raw | processed); None records nothing, and its
        protocol's default applies. `hpc-rollout backend add` asks the server when not told.
        """
        url = normalize_url(url)
        chosen = parse_enum(Protocol, protocol, "protocol") if isinstance(protocol, str) else protocol
        mode = parse_logprob_mode(logprob_mode) if logprob_mode is not None else None
        now = time.time()

        def add_to(snap: Snapshot) -> tuple[Snapshot, Backend]:
            backend = Backend(
                url=url, protocol=chosen, model=model, tokenizer=tokenizer,
                policy_version=snap.policy_version if version is None else check_version(version),
                node=node or node_of(url), state=BackendState.UP,
                added_at=now, state_changed_at=now, logprob_mode=mode,
            )
            others = tuple(b for b in snap.backends if b.url != url)
            top = max(snap.policy_version, backend.policy_version)
            return Snapshot(top, others + (backend,), min_policy_version=snap.min_policy_version), backend
        return self._update(add_to)

    def remove(self, url: str) -> Backend:
        url = normalize_url(url)

        def remove_from(snap: Snapshot) -> tuple[Snapshot, Backend]:
            found = snap.find(url)
            if found is None:
                known = ", ".join(b.url for b in snap.backends) or "none"
                raise RegistryError(f"no backend {url} in the registry; registered: {known}")
            return replace(snap, backends=tuple(b for b in snap.backends if b.url != url)), found
        return self._update(remove_from)

    def clear(self) -> int:
        """Remove every backend (the policy version is kept). Also repairs a corrupt file."""
        return self._update(lambda snap: (
            Snapshot(snap.policy_version, (), min_policy_version=snap.min_policy_version), len(snap.backends)))

    def swap(
        self,
        urls: Sequence[str],
        *,
        version: int | None = None,
        protocol: Protocol | str = Protocol.VLLM,
        model: str | None = None,
        tokenizer: str | None = None,
        logprob_mode: LogprobMode | str | None = None,
    ) -> Snapshot:
        """Replace the whole backend set and bump the policy version in one atomic write.

        Tasks in flight keep their backend (sticky) and finish; their later turns record the
        version the registry gives that URL now.
        """
        if not urls:
            raise RegistryError("swap needs at least one backend URL")
        clean = [normalize_url(u) for u in urls]
        chosen = parse_enum(Protocol, protocol, "protocol") if isinstance(protocol, str) else protocol
        mode = parse_logprob_mode(logprob_mode) if logprob_mode is not None else None
        now = time.time()

        def swap_in(snap: Snapshot) -> tuple[Snapshot, Snapshot]:
            new_version = snap.policy_version + 1 if version is None else check_version(version)
            previous = {b.url: b for b in snap.backends}
            backends = tuple(
                Backend(
                    url=u, protocol=chosen,
                    model=model if model is not None else getattr(previous.get(u), "model", None),
                    tokenizer=tokenizer if tokenizer is not None else getattr(previous.get(u), "tokenizer", None),
                    policy_version=new_version, node=node_of(u),
                    state=BackendState.UP, added_at=now, state_changed_at=now,
                    # a URL kept across the swap keeps what its server said it returns
                    logprob_mode=mode if mode is not None else getattr(previous.get(u), "logprob_mode", None),
                )
                for u in dict.fromkeys(clean)
            )
            new = Snapshot(new_version, backends, min_policy_version=snap.min_policy_version)
            return new, new
        return self._update(swap_in)

    def set_versions(self, urls: Sequence[str], version: int, min_version: int | None = None,
                     drop: Sequence[str] = (), undrain: Sequence[str] = ()) -> Snapshot:
        """After a weight reload: `urls` serve policy `version`, which becomes the registry's.

        Entries in `drop` (backends that could not reload) are removed: probed back to `up`
        later they would serve old weights under the new version. `min_version` sets the
        oldest policy still trained on (None: unchanged). Entries in `undrain` that are still
        `draining` (a rolling swap drained them for their reload) are `up` again, in the same
        write as their new version.
        """
        version = check_version(version)
        now = time.time()

        def reload_in(snap: Snapshot) -> tuple[Snapshot, Snapshot]:
            reloaded, dropped, undrained = set(urls), set(drop), set(undrain)

            def renewed(b: Backend) -> Backend:
                if b.url in undrained and b.state is BackendState.DRAINING:
                    b = replace(b, state=BackendState.UP, reason="", state_changed_at=now)
                return replace(b, policy_version=version) if b.url in reloaded else b
            backends = tuple(renewed(b) for b in snap.backends if b.url not in dropped)
            floor = snap.min_policy_version if min_version is None else check_version(min_version)
            new = Snapshot(max(version, snap.policy_version), backends, min_policy_version=floor)
            return new, new
        return self._update(reload_in)

    def set_states(self, urls: Sequence[str], state: BackendState, reason: str = "",
                   only_from: BackendState | None = None) -> tuple[Backend, ...]:
        """Mark several backends at once (one write); with `only_from`, only those in that state
        now. The entries changed (those no longer registered, or not in `only_from`, are left)."""
        wanted = set(urls)

        def mark_in(snap: Snapshot) -> tuple[Snapshot | None, tuple[Backend, ...]]:
            now = time.time()
            changed = {b.url: replace(b, state=state, reason=reason, state_changed_at=now)
                       for b in snap.backends
                       if b.url in wanted and (only_from is None or b.state is only_from)
                       and (b.state is not state or b.reason != reason)}
            if not changed:
                return None, ()
            return (replace(snap, backends=tuple(changed.get(b.url, b) for b in snap.backends)),
                    tuple(changed.values()))
        return self._update(mark_in)

    def set_state(self, url: str, state: BackendState, reason: str = "") -> Backend | None:
        """Mark a backend up/down/draining; None when it is no longer registered."""

        def mark_in(snap: Snapshot) -> tuple[Snapshot | None, Backend | None]:
            found = snap.find(url)
            if found is None or (found.state is state and found.reason == reason):
                return None, found
            updated = replace(found, state=state, reason=reason, state_changed_at=time.time())
            return replace(snap, backends=tuple(updated if b.url == url else b for b in snap.backends)), updated
        return self._update(mark_in)


def check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise RegistryError(f"policy version {version!r} must be an integer >= 0")
    return version
