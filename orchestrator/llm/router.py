"""Cluster-wide least-in-flight routing with sticky assignment and health marking.

One backend per task: the pick is the `up` backend with the fewest tasks in flight across
every live worker of the run, then the one on this worker's node, then the one with the
fewest lifetime assignments, then random (so racing workers on other nodes spread out); among
them, those at the newest policy version come first (a rolling weight swap, llm/weights.py:
backends waiting for their reload serve the previous version, and get new tasks only when
no backend at the newest one is usable). `draining` backends get no new task.
A failed backend is marked `down` in the registry for everyone and probed again after
`probe_after_s`; the registry is the single place that says which backends exist. A backend
this process has not heard from for `health_check_s` answers `GET /health` before it gets a
task, so a server that hangs or reports itself unhealthy is found before a task waits on it.

Outages: when no backend is usable, a task waits (probing the `down` ones with backoff) for up to
`outage_wait_s` before it fails, and the failure names each backend's last cause. A backend
marked down because a request got no answer (hung, though its /health may still answer) comes
back only after it generates one token, not merely after /health.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from orchestrator.llm.client import NO_ANSWER, ModelInfoCache
from orchestrator.llm.connections import SharedConnections
from orchestrator.llm.http import BackendHttp, HttpFailure
from orchestrator.llm.errors import LLMError, NoBackendAvailable, RegistryCorrupt
from orchestrator.config import DEFAULTS, RunConfig
from orchestrator.llm.inflight import InflightBoard
from orchestrator.spool.cluster_summary import ClusterView
from orchestrator.llm.load_view import LoadView
from orchestrator.llm.registry import Backend, BackendRegistry, BackendState, Snapshot
from orchestrator.llm.urls import health_url
from orchestrator.spool.paths import SpoolPaths, current_node

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 2.0
GENERATION_PROBE_TIMEOUT_S = 10.0
OUTAGE_BACKOFF_S = (0.5, 8.0)


@dataclass
class Router:
    paths: SpoolPaths
    worker_id: str
    node: str = field(default_factory=current_node)
    lease_s: float = DEFAULTS.leases.lease_s
    probe_after_s: float = DEFAULTS.llm.probe_after_s
    # 0 = never check before a pick (a bare Router, as in simulations); router_for() turns it on.
    health_check_s: float = 0.0
    request_timeout_s: float = DEFAULTS.llm.request_timeout_s
    outage_wait_s: float = 0.0       # 0: fail at once when no backend is usable (router_for: run.toml)
    view_s: float = DEFAULTS.llm.view_s   # on a large run, other workers' counts are re-read this often
    registry: BackendRegistry = field(init=False)
    board: InflightBoard = field(init=False)
    # The cluster summary, when the worker engine keeps it (None: this router keeps its own).
    cluster: ClusterView | None = None
    view: LoadView = field(init=False)
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    # Backends this process saw fail, skipped until the registry write catches up everywhere.
    _failed_at: dict[str, float] = field(default_factory=dict, repr=False)
    # When this process last saw each backend answer (a turn or /health).
    _healthy_at: dict[str, float] = field(default_factory=dict, repr=False)
    # When this process last probed each down backend while tasks wait (probes are shared).
    _probed_at: dict[str, float] = field(default_factory=dict, repr=False)
    # Model id and context length of each backend entry, for this worker's tasks.
    model_infos: ModelInfoCache = field(default_factory=ModelInfoCache, repr=False)
    # The keep-alive connections this worker's tasks share (orchestrator/llm/connections.py).
    connections: SharedConnections = field(default_factory=SharedConnections, repr=False)
    # Sessions outside a worker using this router now (session_started / session_ended).
    _sessions: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self.registry = BackendRegistry(self.paths)
        self.board = InflightBoard(self.paths, self.worker_id, self.node, self.lease_s)
        shared = self.cluster is not None
        cluster = self.cluster or ClusterView(self.paths, self.lease_s, self.view_s)
        self.view = LoadView(self.paths, self.lease_s, cluster, shared)
        self.registry.vouch = cluster.registry_key   # large runs: a pick needs no stat of the registry

    async def close(self) -> None:
        """Close the shared connections: the worker stops, its tasks are over."""
        await self.connections.aclose()

    def session_started(self) -> None:
        """A session outside a worker (router_for's router, shared by them) begins."""
        self._sessions += 1

    async def session_ended(self) -> None:
        """A session outside a worker ended: the last one open closes the connections, which
        would otherwise outlive their event loop ("Unclosed client session"); a later session
        opens new ones."""
        self._sessions -= 1
        if self._sessions <= 0:
            self._sessions = 0
            await self.close()

    # -- the decision ---------------------------------------------------------------------
    def choose(self, snapshot: Snapshot, exclude: Collection[str] = ()) -> Backend:
        """The backend a new task should use now (no side effect)."""
        now = time.time()
        usable = [b for b in snapshot.usable() if now - self._failed_at.get(b.url, -1e18) > self.probe_after_s]
        # Backends that failed this task are avoided, not banned: after an outage they may be all there is.
        candidates = [b for b in usable if b.url not in exclude] or usable
        if not candidates:
            raise NoBackendAvailable(self._explain(snapshot, exclude))
        load = self.view.load(self.board, now)
        self.board.publish_every_s = self.view.publish_every_s
        self.board.publish_if_due()
        newest = max(b.policy_version for b in candidates)
        return min(
            candidates,
            key=lambda b: (
                b.policy_version < newest,   # mid rolling swap: the updated backends first
                load.inflight.get(b.url, 0),
                b.node != self.node,
                load.assigned.get(b.url, 0),
                self._rng.random(),
            ),
        )

    async def acquire(self, exclude: Collection[str] = (), wait_s: float | None = None) -> Backend:
        """Pick a backend for a task and count the task in flight on it (cluster-wide).

        With no usable backend, wait up to `wait_s` (default: outage_wait_s) for one to come back.
        """
        wait_s = self.outage_wait_s if wait_s is None else wait_s
        started = time.monotonic()
        delay = OUTAGE_BACKOFF_S[0]
        waiting = False
        unusable = ""   # an unusable registry is an outage too (a worker's reader quarantines it)
        while True:
            try:
                return await self._acquire_now(exclude, force_probe=waiting)
            except (NoBackendAvailable, RegistryCorrupt) as exc:
                if isinstance(exc, RegistryCorrupt):
                    unusable = f"; earlier, {exc}"
                waited = time.monotonic() - started
                if waited + delay > wait_s:
                    if wait_s <= 0:
                        raise
                    raise NoBackendAvailable(f"{exc} (waited {waited:.0f} s for one to come back){unusable}") from None
                if not waiting:
                    log.warning("no usable LLM backend; waiting up to %.0f s: %s", wait_s, exc)
                waiting = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, OUTAGE_BACKOFF_S[1])

    async def _acquire_now(self, exclude: Collection[str], force_probe: bool) -> Backend:
        snapshot = self.registry.read()
        if any(b.state is BackendState.DOWN for b in snapshot.backends):
            snapshot = await self.probe_down(snapshot, force=force_probe)
        unhealthy: list[str] = []
        while True:
            backend = self.choose(snapshot, [*exclude, *unhealthy])
            # Count the task before any await: tasks of this worker picking at the same time
            # must see it, or they all land on the same least-loaded backend.
            self.board.change(backend.url, +1)
            if await self._answers(backend):
                return backend
            self.board.undo(backend.url)
            unhealthy.append(backend.url)
            snapshot = self.registry.read()
            if all(b.url in unhealthy for b in snapshot.usable()):
                raise NoBackendAvailable(self._explain(snapshot, exclude))

    def note_healthy(self, url: str) -> None:
        """`url` just answered a request: no /health check needed for a while."""
        self._healthy_at[url] = time.time()

    async def _answers(self, backend: Backend) -> bool:
        """True unless a due /health check of `backend` fails (then it is marked down)."""
        if not self.health_check_s or time.time() - self._healthy_at.get(backend.url, -1e18) < self.health_check_s:
            return True
        async with BackendHttp(timeout_s=HEALTH_TIMEOUT_S) as http:
            problem = await health_problem(http, backend)
        if problem is None:
            self.note_healthy(backend.url)
        else:
            self.mark_down(backend.url, f"GET {health_url(backend.url)} failed before a task was assigned: {problem}")
        return problem is None

    def release(self, url: str) -> None:
        """The task on `url` finished or moved away."""
        self.board.change(url, -1)

    def min_policy_version(self) -> int:
        """The oldest policy still trained on (0 while the registry is unusable: nothing is judged stale)."""
        try:
            return self.registry.read().min_policy_version
        except RegistryCorrupt:
            return 0

    def current(self, url: str) -> Backend | None:
        """The registry's entry for `url` now (its policy version may have been swapped); None when
        it is gone, or the registry is unusable: a task in flight keeps its backend either way."""
        try:
            return self.registry.read().find(url)
        except RegistryCorrupt:
            return None

    # -- health ---------------------------------------------------------------------------
    def mark_down(self, url: str, reason: str) -> None:
        self._failed_at[url] = time.time()
        log.warning("backend %s marked down: %s", url, reason)
        self._record_state(url, BackendState.DOWN, reason[:300])  # the local mark keeps us off it anyway

    def _record_state(self, url: str, state: BackendState, reason: str) -> None:
        """Write a backend's state to the registry; a registry that cannot be written (a full spool,
        a held lock) leaves it as it was, which costs waiting, never a task."""
        try:
            self.registry.set_state(url, state, reason)
        except (OSError, LLMError) as exc:
            log.warning("could not record %s as %s in the registry: %s", url, state.value, exc)

    async def probe_down(self, snapshot: Snapshot, force: bool = False) -> Snapshot:
        """Probe `down` backends whose last change is older than probe_after_s (any, when `force`:
        tasks are waiting, at most once per backoff step); revive the healthy ones."""
        now = time.time()
        due = [
            b for b in snapshot.backends
            if b.state is BackendState.DOWN and (
                now - b.state_changed_at > self.probe_after_s
                or (force and now - self._probed_at.get(b.url, -1e18) >= OUTAGE_BACKOFF_S[0]))
        ]
        if not due:
            return snapshot
        async with BackendHttp(timeout_s=HEALTH_TIMEOUT_S) as http:
            for backend in due:
                self._probed_at[backend.url] = time.time()
                hung = NO_ANSWER in backend.reason
                problem = await health_problem(http, backend)
                if problem is None and hung:
                    # /health alone proved nothing; one token, no slower than a request may be
                    problem = await generation_problem(http, backend, min(GENERATION_PROBE_TIMEOUT_S, self.request_timeout_s))
                healthy = problem is None
                state = BackendState.UP if healthy else BackendState.DOWN
                reason = "" if healthy else backend.reason if hung else f"probe: {problem}"
                if healthy:
                    self._failed_at.pop(backend.url, None)
                    self.note_healthy(backend.url)
                # Rewriting DOWN refreshes state_changed_at: the next probe waits again.
                self._record_state(backend.url, state, reason or "probe failed")
                log.info("probed %s: %s", backend.url, state.value)
        return self.registry.read()

    def _explain(self, snapshot: Snapshot, exclude: Collection[str]) -> str:
        if not snapshot.backends:
            return (
                f"no LLM backend is registered in {self.paths.backends}: add one with "
                f"`hpc-rollout backend add {self.paths.root} URL`"
            )
        states = ", ".join(
            f"{b.url} ({b.state.value}{': ' + b.reason if b.reason else ''}"
            f"{'; failed for this task' if b.url in exclude else ''})"
            for b in snapshot.backends
        )
        return f"no usable LLM backend: {states}; start one or re-add it with `hpc-rollout backend add`"


async def probe(http: BackendHttp, backend: Backend) -> bool:
    return await health_problem(http, backend) is None


async def health_problem(http: BackendHttp, backend: Backend) -> str | None:
    """None when GET /health answers 200 within HEALTH_TIMEOUT_S in all, else what went wrong."""
    try:
        response = await http.get(health_url(backend.url), timeout_s=HEALTH_TIMEOUT_S)
    except TimeoutError:
        return f"GET /health: {NO_ANSWER} {HEALTH_TIMEOUT_S:g} s"
    except HttpFailure as exc:
        return str(exc)
    return None if response.status == 200 else f"GET /health answered HTTP {response.status}"


async def generation_problem(http: BackendHttp, backend: Backend,
                             timeout_s: float = GENERATION_PROBE_TIMEOUT_S) -> str | None:
    """None when the backend samples one token within `timeout_s`, else why not."""
    from orchestrator.llm.client import RetryPolicy
    from orchestrator.llm.protocol_clients import client_for

    client = client_for(backend, http, RetryPolicy(attempts=1, timeout_s=timeout_s))
    try:
        await client.generate([0], {"max_tokens": 1})
    except LLMError as exc:
        return str(exc)
    return None


def router_from_config(paths: SpoolPaths, worker_id: str, node: str, config: RunConfig,
                       cluster: ClusterView | None = None) -> Router:
    """The router a worker builds once from its RunConfig and hands to its jobs (WorkerServices).

    The lease is [leases] lease_s (as the worker heartbeats by it), the health timings [llm]
    health_check_s and probe_after_s, the outage handling [llm] request_timeout_s and outage_wait_s,
    the cluster view [llm] view_s.
    """
    return Router(
        paths, worker_id, node,
        lease_s=config.leases.lease_s,
        probe_after_s=config.llm.probe_after_s,
        health_check_s=config.llm.health_check_s,
        request_timeout_s=config.llm.request_timeout_s,
        outage_wait_s=config.llm.outage_wait_s,
        view_s=config.llm.view_s,
        cluster=cluster,
    )


# Only for job contexts built outside a worker (`tasks check`, scripts, tests): a worker injects its own.
_routers: dict[tuple[str, str], Router] = {}


def router_for(paths: SpoolPaths, worker_id: str, node: str | None = None) -> Router:
    """The one router of this process for (run dir, worker id), for callers that are not a worker.

    Settings come from the run's run.toml like router_from_config (lease, health timings, outage
    handling, the cluster view [llm] view_s); a missing or broken run.toml raises ConfigError.
    """
    key = (str(paths.root), worker_id)
    router = _routers.get(key)
    if router is None:
        router = router_from_config(paths, worker_id, node or current_node(), RunConfig.load(paths.run_config))
        _routers[key] = router
    return router


def run_lease_s(paths: SpoolPaths) -> float:
    """The run's worker lease (run.toml [leases] lease_s): in-flight counts expire with it."""
    return RunConfig.load(paths.run_config).leases.lease_s
