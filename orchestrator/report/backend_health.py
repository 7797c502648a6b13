"""The LLM backends as a person needs to see them: which are up, which are down, and since when
no backend at all has been usable (while jobs wait for one, up to [llm] outage_wait_s each).

What `status`, its --json and the `launch --wait` bar show. Read from the registry
(backends.json, one stat when unchanged) and, only while no backend is usable, its history
(backends/history.jsonl) for the moment the last usable one went away.

States shown:
    up        takes new tasks
    down      failed; workers leave it alone for [llm] probe_after_s
    probing   down for longer than that: workers try it again (GET /health) before they pick
    draining  takes no new tasks; tasks already on it finish there
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from orchestrator.config import RunConfig
from orchestrator.llm.errors import LLMError
from orchestrator.llm.history import read_history
from orchestrator.llm.registry import BackendRegistry, BackendState, Snapshot
from orchestrator.spool.paths import SpoolPaths

PROBING = "probing"


@dataclass(frozen=True)
class BackendView:
    url: str
    state: str            # up | down | probing | draining
    reason: str
    since: float          # when it entered its registry state (epoch seconds)

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "state": self.state, "reason": self.reason, "since": self.since}


@dataclass(frozen=True)
class BackendHealth:
    backends: tuple[BackendView, ...] = ()
    unusable_since: float | None = None   # set when backends are registered and none is usable
    outage_wait_s: float = 0.0
    problem: str = ""                     # the registry could not be read

    @property
    def registered(self) -> bool:
        return bool(self.backends)

    def counts(self) -> str:
        """E.g. '1 up, 2 down' (states in a fixed order)."""
        order = ("up", "probing", "down", "draining")
        found = {state: sum(b.state == state for b in self.backends) for state in order}
        return ", ".join(f"{count} {state}" for state, count in found.items() if count)

    def outage(self) -> str | None:
        """The one line that says jobs are waiting for a backend, or None while one is usable."""
        if self.problem:
            return f"backend registry unreadable: {self.problem}"
        if self.unusable_since is None:
            return None
        clock = time.strftime("%H:%M:%S", time.localtime(self.unusable_since))
        return (f"no usable backend since {clock}: jobs waiting (each up to outage_wait_s = "
                f"{self.outage_wait_s:g} s, then it fails); `hpc-rollout backend list` says why")

    def to_json(self) -> dict[str, Any]:
        return {"backends": [b.to_json() for b in self.backends], "unusable_since": self.unusable_since,
                "outage_wait_s": self.outage_wait_s, **({"problem": self.problem} if self.problem else {})}


def backend_health(paths: SpoolPaths, config: RunConfig, registry: BackendRegistry | None = None,
                   now: float | None = None) -> BackendHealth:
    """How the run's backends stand now; pass a kept `registry` to poll cheaply (one stat)."""
    now = time.time() if now is None else now
    try:
        snapshot = (registry or BackendRegistry(paths)).read()
    except (LLMError, OSError) as exc:
        return BackendHealth(outage_wait_s=config.llm.outage_wait_s, problem=str(exc))
    views = tuple(BackendView(b.url, _shown_state(b.state, now - b.state_changed_at, config), b.reason,
                              b.state_changed_at) for b in snapshot.backends)
    unusable = None
    if snapshot.backends and not snapshot.usable():
        unusable = _last_usable_gone(paths, snapshot)
    return BackendHealth(views, unusable, config.llm.outage_wait_s)


def _shown_state(state: BackendState, for_s: float, config: RunConfig) -> str:
    if state is BackendState.DOWN and for_s >= config.llm.probe_after_s:
        return PROBING
    return state.value


def _last_usable_gone(paths: SpoolPaths, snapshot: Snapshot) -> float:
    """When the run last went from some usable backend to none: from the registry's history, else
    the latest state change of the backends registered now."""
    history, _ = read_history(paths.backends_history)
    usable: set[str] = set()
    gone_at: float | None = None
    for change in history:
        url, kind = str(change.get("url")), change.get("change")
        had_some = bool(usable)
        if kind == "removed" or change.get("state") != BackendState.UP.value:
            usable.discard(url)
        elif kind in ("added", "state", "version"):
            usable.add(url)
        if had_some and not usable:
            gone_at = float(change.get("t", 0.0))
        elif usable:
            gone_at = None
    if gone_at is not None:
        return gone_at
    return max(b.state_changed_at for b in snapshot.backends)
