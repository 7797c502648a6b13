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

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from orchestrator.llm.backend_entries import (FORMAT, Backend, BackendState, Protocol, Snapshot, check_version,
                                              node_of, normalize_url, parse_enum, parse_snapshot)
from orchestrator.llm.errors import RegistryError
from orchestrator.llm.logprob_mode import LogprobMode, parse_logprob_mode
from orchestrator.llm.registry_file import RegistryFile

# The entries and the file's handling have modules of their own; their names are found here too,
# where every caller has always imported them.
__all__ = ["FORMAT", "Backend", "BackendRegistry", "BackendState", "Protocol", "Snapshot", "check_version",
           "node_of", "normalize_url", "parse_enum", "parse_snapshot"]


@dataclass
class BackendRegistry(RegistryFile):
    """Read and change `backends.json` of one run directory: reading, caching, setting aside and
    the locked, fenced writes are RegistryFile's (orchestrator/llm/registry_file.py); the changes
    a trainer or `hpc-rollout backend` makes are here.
    """

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
