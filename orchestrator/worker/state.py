"""What the collaborators of one worker share: who it is, its handles on the spool, the jobs it
carries in memory, its pools, and whether it is stopping or has lost its lease.

The collaborators (worker/engine.py wires them): `Dispatcher` (where each stage's next job comes
from), `JobRunner` (one stage of one job), `TicketMoves` (where a ticket goes next), `Committer`
(rows into shards, then their claims dropped), `Housekeeping` (the periodic duties) and
`Drain` (what a stopping worker gives back). Each reads and changes this state; none holds a
second copy of it. The spool stays the truth: what is here only says what this process carries.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from orchestrator.config import RunConfig
from orchestrator.handler_api.context import WorkerServices
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.router import router_from_config
from orchestrator.metrics.recent import RecentJobs
from orchestrator.sandbox.policy import SandboxPolicy
from orchestrator.spool import access, fsops
from orchestrator.spool.launches import stop_baseline
from orchestrator.spool.cancel import CancelWatch
from orchestrator.spool.claims import ClaimBox, Claimer
from orchestrator.spool.cluster_summary import LARGE_RUN_WORKERS, ClusterView
from orchestrator.spool.events import EventLog
from orchestrator.spool.jobs import Stage
from orchestrator.spool.journal import Journal
from orchestrator.spool.liveness import base_info, write_heartbeat
from orchestrator.spool.paths import SpoolPaths, current_node
from orchestrator.spool.shards import ShardWriter
from orchestrator.spool.tickets import Ticket
from orchestrator.worker.admission import Admission
from orchestrator.worker.held_batches import BatchClaims
from orchestrator.worker.options import WorkerOptions

log = logging.getLogger(__name__)


def fresh_worker_id() -> str:
    """NODE-PID-RANDOM: unique across the run, and says where to look for the process."""
    return f"{current_node()}-{os.getpid()}-{secrets.token_hex(2)}"


class Slot:
    """One taken slot of a stage's pool, given back exactly once (a second give_back is a no-op:
    the paths that end a stage early and the task's own end cannot both return it)."""

    def __init__(self, pool: asyncio.Semaphore) -> None:
        self._pool: asyncio.Semaphore | None = pool

    def give_back(self) -> None:
        if self._pool is not None:
            self._pool.release()
            self._pool = None


@dataclass
class StagePools:
    """Per stage: its slots (the pool size), how many stages run, and the dispatcher's wake-up.

    Slots are taken and given back only here (`take`, `take_if_free`, Slot.give_back) and the
    busy counts change only through `stage_started`/`stage_ended`: tests/core/test_worker_memory.py."""

    _slots: dict[Stage, asyncio.Semaphore]
    _busy: dict[Stage, int]
    wake: dict[Stage, asyncio.Event]

    @classmethod
    def sized(cls, options: WorkerOptions) -> "StagePools":
        return cls.of_sizes({s: options.pool_size(s) for s in Stage})

    @classmethod
    def of_sizes(cls, sizes: dict[Stage, int]) -> "StagePools":
        return cls({s: asyncio.Semaphore(sizes[s]) for s in Stage}, {s: 0 for s in Stage},
                   {s: asyncio.Event() for s in Stage})

    async def take(self, stage: Stage) -> Slot:
        """A slot of `stage`, once one is free."""
        await self._slots[stage].acquire()
        return Slot(self._slots[stage])

    async def take_if_free(self, stage: Stage) -> Slot | None:
        """A slot of `stage` when one is free now (its acquire returns at once); None otherwise."""
        if self._slots[stage].locked():
            return None
        return await self.take(stage)

    def busy(self, stage: Stage) -> int:
        """Stages of `stage` running now (slot or not)."""
        return self._busy[stage]

    def stage_started(self, stage: Stage) -> None:
        self._busy[stage] += 1

    def stage_ended(self, stage: Stage) -> None:
        self._busy[stage] -= 1

    def wake_all(self) -> None:
        for event in self.wake.values():
            event.set()


@dataclass
class HeldJobs:
    """The jobs this worker carries in memory, by job id (their claims are in its claim directory).

    Read anywhere; changed only through the methods below, one per move, so every collaborator
    moves a job the same way (tests/core/test_worker_memory.py forbids writing the fields elsewhere)."""

    running: dict[str, tuple[asyncio.Task[None], Stage]] = field(default_factory=dict)
    in_flight: dict[str, Ticket] = field(default_factory=dict)   # the ticket of each running stage
    user_cancelled: set[str] = field(default_factory=set)
    # Jobs INIT prepared here while every RUN slot was busy, oldest first. They wait in memory,
    # not in the node's run queue: their claims (still saying INIT) stay in the claim directory,
    # so a crash sends them back to INIT, as it would from the run queue.
    prepared: dict[str, Ticket] = field(default_factory=dict)
    # Jobs of claimed batch files waiting for an INIT slot, oldest first (like prepared jobs, in
    # memory: the batch file in the claim directory stands for them until each resolves).
    waiting_init: dict[str, Ticket] = field(default_factory=dict)
    # Jobs whose RUN ended here while every EVAL slot was busy, oldest first: they wait for one
    # here (RUN output journaled; the claim stays) rather than in queue/eval (a ticket write, a
    # claim, a read), up to one EVAL pool's worth; beyond, other workers may help.
    waiting_eval: dict[str, Ticket] = field(default_factory=dict)
    # Tickets this worker queued itself, by name: read back from memory when it claims them again.
    written: dict[str, Ticket] = field(default_factory=dict)

    def names(self) -> set[str]:
        """Every job a task or a waiting list of this worker carries."""
        return set(self.running) | set(self.prepared) | set(self.waiting_init) | set(self.waiting_eval)

    def holding(self) -> bool:
        return bool(self.running or self.prepared or self.waiting_init or self.waiting_eval)

    # -- a stage's task ---------------------------------------------------------------------
    def task_started(self, name: str, task: asyncio.Task[None], stage: Stage) -> None:
        self.running[name] = (task, stage)

    def carrying(self, name: str, ticket: Ticket) -> None:
        """The ticket a running stage of `name` works on."""
        self.in_flight[name] = ticket

    def task_ended(self, name: str, task: asyncio.Task[None]) -> None:
        """`task` ended; forget the job unless it was handed to its next stage here meanwhile."""
        if self.running.get(name, (None,))[0] is task:
            del self.running[name]
            self.in_flight.pop(name, None)
            self.user_cancelled.discard(name)

    def cancel_running(self, name: str) -> None:
        """The user cancelled the running job `name`: its stage ends as cancelled."""
        self.user_cancelled.add(name)
        self.running[name][0].cancel()

    # -- waiting here -------------------------------------------------------------------------
    def keep_prepared(self, ticket: Ticket) -> None:
        self.prepared[ticket.name] = ticket

    def take_prepared(self, name: str) -> Ticket:
        return self.prepared.pop(name)

    def wait_for_eval(self, ticket: Ticket) -> None:
        self.waiting_eval[ticket.name] = ticket

    def take_waiting_eval(self, name: str | None = None) -> Ticket:
        """`name`, or the oldest job waiting for an EVAL slot."""
        return self.waiting_eval.pop(name or next(iter(self.waiting_eval)))

    def wait_for_init(self, ticket: Ticket) -> None:
        self.waiting_init[ticket.name] = ticket

    def take_waiting_init(self, name: str | None = None) -> Ticket:
        """`name`, or the oldest job of a held batch waiting for an INIT slot."""
        return self.waiting_init.pop(name or next(iter(self.waiting_init)))

    def forget_waiting_init(self, name: str) -> Ticket | None:
        return self.waiting_init.pop(name, None)

    def take_all_waiting_init(self) -> dict[str, Ticket]:
        """Every job of a held batch waiting for INIT (a stopping worker gives them back)."""
        waiting, self.waiting_init = self.waiting_init, {}
        return waiting

    def take_all_waiting_eval(self) -> dict[str, Ticket]:
        waiting, self.waiting_eval = self.waiting_eval, {}
        return waiting

    # -- tickets this worker queued itself ----------------------------------------------------
    def remember_written(self, ticket: Ticket) -> None:
        self.written[ticket.name] = ticket

    def take_written(self, name: str) -> Ticket | None:
        return self.written.pop(name, None)

    def forget_written_before(self, horizon: float) -> None:
        for name in [n for n, t in self.written.items() if t.enqueued_at < horizon]:
            del self.written[name]


@dataclass
class RunQueueCount:
    """Jobs waiting in this node's run queue as last listed, corrected by this worker's own moves."""

    seen: int = 0
    listed_at: float = 0.0   # time.monotonic() of the last listing


class WorkerState:
    """One worker's identity, spool handles, held jobs, pools and life flags."""

    def __init__(self, paths: SpoolPaths, config: RunConfig, options: WorkerOptions) -> None:
        self.paths = paths
        self.config = config
        self.options = options.resolve(config)
        self.node = current_node()
        # The run's modes for everything this worker creates, and whose files it acts on.
        access.use(config.access)
        owners = access.Owners.of(paths, config.access)
        owners.check_self(paths)
        access.trust(paths, owners)
        # Directories others could drop or swap files in are closed before anything in them is
        # read (AccessError, naming the fix, when this user cannot): docs/robustness.md.
        repaired = access.tighten(access.working_directories(paths))
        self.worker_id = self.options.worker_id or fresh_worker_id()
        self.info = base_info(self.node, self.options.launch_id)
        # A stop request is one made after this worker was launched: another identity of
        # control/stop than the one its launcher saw (its mtime is never compared with a clock).
        with fsops.duty("stop_poll"):
            self.stop_seen = stop_baseline(paths)
        # The heartbeat exists before the claim directory, so recovery never takes a starting
        # worker's directory for an abandoned one.
        write_heartbeat(paths, self.worker_id, {**self.info, "state": "starting"})
        self.box = ClaimBox(paths, self.worker_id, on_quarantine=self.quarantined)
        # RUN outputs this worker evaluates itself are appended here, not saved in their claims.
        self.journal = Journal.open(self.box.dir)
        self.run_queue = paths.run_queue(self.node)
        fsops.ensure_dir(self.run_queue)
        self.events = EventLog(paths, self.worker_id)
        for change in repaired:
            self.access_repaired(change)
        self.shards = ShardWriter(paths, self.worker_id, config.shards)
        self.batches = BatchClaims(self.box, self.shards)
        self.cancels = CancelWatch(paths)
        # Large runs only: what the worker knows of the others, read once per rebuild period.
        self.cluster = ClusterView(paths, config.leases.lease_s, config.llm.view_s)
        self.cluster_workers = 1   # heartbeats the last recovery scan saw (sets the poll periods)
        # Its min_policy_version says which samples are stale (vouched for by the summary on large runs).
        self.registry = BackendRegistry(paths, vouch=self.cluster.registry_key)
        self.services = WorkerServices(
            paths=paths, worker_id=self.worker_id, node=self.node, runtime=str(self.options.runtime),
            sandbox_defaults=config.sandbox.defaults(), sandbox_policy=SandboxPolicy.of(config.sandbox),
            emit=self.events.emit,
            llm_router=router_from_config(paths, self.worker_id, self.node, config, self.cluster), proxy=config.proxy,
            rewards=config.rewards,
        )
        for registry in (self.registry, *([self.services.llm_router.registry] if self.services.llm_router else [])):
            registry.quarantine_unusable = True      # an unusable registry goes to quarantine/: an outage, not a crash
            registry.on_quarantine = self.registry_quarantined
        self.pools = StagePools.sized(self.options)
        # Where run.toml declares resource classes: what this worker's sandboxes hold, and which job
        # goes next (worker/admission.py); None: first come, first served.
        self.admission = Admission.of(config, on_admit=lambda name, fields: self.events.emit(name, "admitted", fields))
        self.claimers = {s: Claimer(self.queue_of(s), self.box.dir) for s in Stage}
        self.jobs = HeldJobs()
        self.run_queue_count = RunQueueCount()
        self.counters: dict[str, int] = {"claimed": 0, "finished": 0, "failed": 0, "requeued": 0}
        self.recent = RecentJobs()   # the last minute of rows it finished, for live metrics
        self.stopping = asyncio.Event()
        self.grace_s = config.shutdown.grace_s
        self.state = "running"
        self.lease_lost: str | None = None       # why this worker no longer holds its claims
        # Blocking spool work runs off the event loop: shard commits and recovery in one thread
        # (one at a time), heartbeats in another (never queued behind a slow commit).
        self.spool_io = ThreadPoolExecutor(1, thread_name_prefix="spool-io")
        self.heartbeat_io = ThreadPoolExecutor(1, thread_name_prefix="heartbeat")

    def own_directories(self) -> list[Path]:
        """The directories this worker takes files from: held closed by its access check."""
        paths = self.paths
        return [paths.root, paths.queue, paths.init_queue, paths.eval_queue, self.run_queue, paths.active, self.box.dir]

    def check_directories(self) -> None:
        """Close again what someone opened since (an event and a warning each), or say loudly
        that this user cannot: the per-file checks still hold meanwhile (spool/access.py)."""
        try:
            changes = access.tighten(self.own_directories())
        except access.AccessError as exc:
            log.error("%s", exc)
            self.events.emit("-", "access_loose", {"reason": str(exc)})
            return
        for change in changes:
            self.access_repaired(change)

    def access_repaired(self, change: str) -> None:
        log.warning("repaired %s", change)
        self.events.emit("-", "access_repaired", {"reason": change})

    def quarantined(self, name: str, reason: str) -> None:
        self.events.emit(name, "quarantined", {"reason": reason})

    def registry_quarantined(self, reason: str) -> None:
        self.events.emit("-", "registry_quarantined", {"reason": reason})

    def queue_of(self, stage: Stage) -> Path:
        return {Stage.INIT: self.paths.init_queue, Stage.RUN: self.run_queue, Stage.EVAL: self.paths.eval_queue}[stage]

    def runs(self, stage: Stage) -> bool:
        """This worker has slots for `stage`."""
        return stage in self.options.stages and self.options.pool_size(stage) > 0

    def keeps_prepared(self) -> bool:
        """This worker runs what it prepares (it has RUN slots), so prepared jobs wait in memory."""
        return self.runs(Stage.RUN)

    def poll_period(self, small_run_s: float, large_run_s: float) -> float:
        return small_run_s if self.cluster_workers <= LARGE_RUN_WORKERS else large_run_s

    def count_workers(self, heartbeats: int) -> None:
        """How many workers the run has, as a recovery scan or the cluster summary saw."""
        self.cluster_workers = heartbeats
        for stage in (Stage.INIT, Stage.EVAL):   # the shared queues: every worker claims there
            self.claimers[stage].claimers = heartbeats

    def request_stop(self, grace_s: float | None = None) -> None:
        """Stop claiming; finish running stages within `grace_s`, then return what is left."""
        if grace_s is not None:
            self.grace_s = min(self.grace_s, grace_s) if self.stopping.is_set() else grace_s
        elif self.stopping.is_set():
            self.grace_s = 0.0  # asked twice: stop now
        self.stopping.set()

    async def in_spool_io(self, call: Callable[..., Any], *args: Any) -> Any:
        """Run blocking spool work in the spool thread; the calling task's fsops duty goes with it."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self.spool_io, context.run, call, *args)

    def requeued(self, moved: int) -> None:
        """Claims returned to the queues (ours or a dead worker's): count them, wake every dispatcher."""
        if moved:
            self.counters["requeued"] += moved
            self.pools.wake_all()
