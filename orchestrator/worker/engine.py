"""The worker: INIT, RUN and EVAL pools of one process, fed by claims from the spool.

Each pool has a dispatcher that claims a ticket whenever a slot is free and starts the stage
as an asyncio task. Between stages a ticket goes back through the spool (node-local run
queue, shared eval queue), so another process can pick it up and a crash loses nothing; the
worker only keeps a cache of tickets it wrote itself, to skip re-reading them.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import logging
import os
import secrets
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from orchestrator.spool import access, fsops
from orchestrator.spool.batches import is_batch
from orchestrator.spool.cancel import CancelWatch
from orchestrator.spool.claims import ClaimBox, Claimer
from orchestrator.spool.cluster_summary import LARGE_RUN_WORKERS, ClusterView, Summary
from orchestrator.config import RunConfig
from orchestrator.handler_api.context import JobContext, WorkerServices
from orchestrator.spool.events import EventLog
from orchestrator.handler_api.contract import AgentHandler, HandlerError, load_handler
from orchestrator.spool.jobs import StageError
from orchestrator.spool.jobs import JobStatus, Stage
from orchestrator.spool.journal import Journal, JournalEntry, RecordKind
from orchestrator.spool.liveness import base_info, retire, write_heartbeat
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.router import router_from_config
from orchestrator.metrics.prometheus import prometheus_exporter
from orchestrator.spool.paths import SpoolPaths, current_node
from orchestrator.spool.recovery import reap_expired, reap_found, release_own_claims, requeue_claim
from orchestrator.spool.rows import build_row
from orchestrator.sandbox.policy import SandboxPolicy, SandboxPolicyError
from orchestrator.sandbox.workspace import removable_workspaces
from orchestrator.spool.shards import FencedOut, ShardWriter, UnflushedShard
from orchestrator.spool.staleness import STALE_KIND, stale_reason
from orchestrator.spool.tickets import Ticket
from orchestrator.worker.held_batches import BatchClaims
from orchestrator.worker.idle import IdleClock, poll_period
from orchestrator.worker.options import WorkerOptions
from orchestrator.worker.stages import execute_stage, final_fields

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.5
CANCEL_SWEEP_S = 10.0
STOP_POLL_S = 1.0
# A run of more than LARGE_RUN_WORKERS workers learns of cancel/ and control/stop from the cluster
# summary (orchestrator/spool/cluster_summary.py), and polls them itself, less often, only while it has none:
# each poll is a metadata operation per node, 3,000 per second at 1,000 nodes (docs/scale.md).
CANCEL_POLL_LARGE_S = 2.0
STOP_POLL_LARGE_S = 5.0
SWEEP_EVERY_S = 60.0
MIN_IDLE_BACKOFF_S = 0.002
MAX_IDLE_BACKOFF_S = 0.25
# An idle dispatcher's polls of its (empty) queue on a large run: work of its own wakes it at
# once, so the polls only look for other workers' tickets, from this floor up to this period.
MIN_IDLE_BACKOFF_LARGE_S = 1.0
MAX_IDLE_BACKOFF_LARGE_S = 2.0
# On a large run an idle dispatcher polls a queue the cluster summary says is empty only this
# often (the summary's rebuilder looks at the shared queues; a node's run queue fills only
# when the summary shows a `--stages init` worker on the node).
UNHINTED_POLL_LARGE_S = 30.0
HEARTBEAT_FAILURES_FATAL = 5
CACHE_TRUST_S = 10.0   # below any sensible lease: a ticket we wrote this recently was not recovered
COMMIT_RETRY_S = (0.5, 30.0)   # backoff of shard commits that failed (full disk, I/O error)
EXIT_LEASE_LOST = 3    # serve() result when the worker's claims were taken over (see main.py)


@dataclass(frozen=True)
class Settling:
    """A shard renamed into shards/ (its rows committed) whose claims are still to be dropped."""

    tickets: list[str]
    shard_seq: int
    remove_workspaces_of: list[str]
    flushed: bool     # shards/ flushed since the rename


class Worker:
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
        self.worker_id = self.options.worker_id or f"{self.node}-{os.getpid()}-{secrets.token_hex(2)}"
        self.started_at = time.time()
        self.info = base_info(self.node, self.options.launch_id)
        # The heartbeat exists before the claim directory, so recovery never takes a starting
        # worker's directory for an abandoned one.
        write_heartbeat(paths, self.worker_id, {**self.info, "state": "starting"})
        self.box = ClaimBox(paths, self.worker_id, on_quarantine=self._quarantined)
        # RUN outputs this worker evaluates itself are appended here, not saved in their claims.
        self.journal = Journal.open(self.box.dir)
        self.run_queue = paths.run_queue(self.node)
        fsops.ensure_dir(self.run_queue)
        self.events = EventLog(paths, self.worker_id)
        self.shards = ShardWriter(paths, self.worker_id, config.shards)
        self.cancels = CancelWatch(paths)
        # Large runs only: what the worker knows of the others, read once per rebuild period.
        self.cluster = ClusterView(paths, config.leases.lease_s, config.llm.view_s)
        # Its min_policy_version says which samples are stale (vouched for by the summary on large runs).
        self.registry = BackendRegistry(paths, vouch=self.cluster.registry_key)
        self.services = WorkerServices(
            paths=paths, worker_id=self.worker_id, node=self.node, runtime=str(self.options.runtime),
            sandbox_defaults=config.sandbox.defaults(), sandbox_policy=SandboxPolicy.of(config.sandbox),
            emit=self.events.emit,
            llm_router=router_from_config(paths, self.worker_id, self.node, config, self.cluster),
        )
        for registry in (self.registry, *([self.services.llm_router.registry] if self.services.llm_router else [])):
            registry.quarantine_unusable = True      # an unusable registry goes to quarantine/: an outage, not a crash
            registry.on_quarantine = self._registry_quarantined
        self.idle = IdleClock(float(self.options.idle_exit_s or 0))
        self.metrics = prometheus_exporter(paths, config, self.worker_id)
        self.slots = {s: asyncio.Semaphore(self.options.pool_size(s)) for s in Stage}
        self.claimers = {s: Claimer(self._queue_of(s), self.box.dir) for s in Stage}
        self.busy = {s: 0 for s in Stage}
        self.wake = {s: asyncio.Event() for s in Stage}
        self.counters: dict[str, int] = {"claimed": 0, "finished": 0, "failed": 0, "requeued": 0}
        self.running: dict[str, tuple[asyncio.Task[None], Stage]] = {}
        self.user_cancelled: set[str] = set()
        self.written: dict[str, Ticket] = {}   # tickets this worker queued, by name
        # Jobs INIT prepared here while every RUN slot was busy, oldest first. They wait in
        # memory, not in the node's run queue: their claims (still saying INIT) stay in the
        # claim directory, so a crash sends them back to INIT, as it would from the run queue.
        self.prepared: dict[str, Ticket] = {}
        # Jobs of claimed batch files waiting for an INIT slot, oldest first (like prepared jobs,
        # in memory: the batch file in the claim directory stands for them until each resolves).
        self.waiting_init: dict[str, Ticket] = {}
        # Jobs whose RUN ended here while every EVAL slot was busy, oldest first: they wait for
        # one here (RUN output journaled; the claim stays) rather than in queue/eval (a ticket
        # write, a claim, a read), up to one EVAL pool's worth; beyond, other workers may help.
        self.waiting_eval: dict[str, Ticket] = {}
        self.batches = BatchClaims(self.box, self.shards)
        self._tickets_in_flight: dict[str, Ticket] = {}
        self.handlers: dict[str, AgentHandler] = {}
        self.prepared_seen = 0
        self.cancel_swept_at = 0.0
        self.prepared_seen_at = 0.0
        self.stopping = asyncio.Event()
        self.grace_s = config.shutdown.grace_s
        self.fatal: BaseException | None = None
        self.state = "running"
        self.cluster_workers = 1   # heartbeats the last recovery scan saw (sets the poll periods)
        # Blocking spool work runs off the event loop: shard commits and recovery in one thread
        # (one at a time), heartbeats in another (never queued behind a slow commit).
        self.spool_io = ThreadPoolExecutor(1, thread_name_prefix="spool-io")
        self.heartbeat_io = ThreadPoolExecutor(1, thread_name_prefix="heartbeat")
        self.committing: list[str] = []          # tickets of the shard being written right now
        self.commit_retry_at = 0.0
        self.settling: Settling | None = None    # the last shard renamed in, while its claims are not all dropped
        self.commit_failures = 0
        self.lease_lost: str | None = None       # why this worker no longer holds its claims
        self.stray_claims: set[str] = set()
        self.workspaces_to_remove: set[str] = set()  # jobs whose host workspaces go with their row

    # -- life cycle ---------------------------------------------------------------------------
    async def serve(self) -> int:
        """Run until asked to stop; the exit code (EXIT_LEASE_LOST when fenced out)."""
        self._heartbeat()
        self.events.emit("-", "worker_started", {"node": self.node, "pid": os.getpid(), "stages": sorted(s.value for s in self.options.stages)})
        log.info("worker %s on %s: pools %s", self.worker_id, self.node, {s.value: self.options.pool_size(s) for s in Stage})
        self._sweep_sandboxes()
        with fsops.duty("cancel_poll"):   # requests made before this worker started hold from its first claim
            self.cancels.refresh()
        background = [
            self._background("heartbeat", self.config.leases.heartbeat_s, self._heartbeat_checked),
            self._background("recovery", max(self.config.leases.lease_s / 3, 0.1), self._recover),
            self._background("cluster_view", max(self.config.llm.view_s, 0.5), self._refresh_cluster_view),
            self._background("cancel_poll", lambda: self._request_poll_period(CANCEL_POLL_S, CANCEL_POLL_LARGE_S),
                             self._poll_cancels),
            self._background("stop_poll", lambda: self._request_poll_period(STOP_POLL_S, STOP_POLL_LARGE_S),
                             self._poll_stop_request),
            self._background("commit", 0.05, self._commit_shards_if_due),
            self._background("sandbox_sweep", SWEEP_EVERY_S, self._sweep_in_background),
            self._background("claim_audit", self.config.leases.lease_s, self._audit_claims),
        ]
        if self.idle.enabled:
            period = poll_period(self.idle.idle_exit_s, self.config.leases.heartbeat_s)
            background.append(self._background("idle_exit", period, self._exit_if_idle))
        dispatchers = [
            asyncio.create_task(self._dispatch(stage), name=f"dispatch-{stage.value}")
            for stage in Stage if self.options.pool_size(stage) > 0
        ]
        for task in background + dispatchers:
            task.add_done_callback(self._essential_done)
        await self.stopping.wait()
        self.state = "draining"
        if not self.lease_lost:
            self._heartbeat()
        for task in dispatchers:
            task.cancel()
        await asyncio.gather(*dispatchers, return_exceptions=True)
        await self._drain()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        self.journal.close()   # what it holds goes with the claims left (recovery reads it)
        if not self.lease_lost:
            await self._commit_shards()
            if not self.shards.pending:
                self.shards.close()   # readers stop probing this writer
            self.batches.close(stopped_cleanly=True)
            leftovers = await self._in_spool_io(
                release_own_claims, self.paths, self.worker_id, self.config.jobs.max_attempts, self.events.emit)
            self.counters["requeued"] += leftovers
            self.state = "stopped" if self.fatal is None else "failed"
            self._heartbeat()
        else:
            self.shards.take()  # rows of claims other workers now hold: never committed
            self.state = "fenced"
        self.batches.close(stopped_cleanly=False)
        retire(self.paths, self.worker_id)
        if self.metrics is not None:
            self.metrics.remove()
        self.events.emit("-", "worker_stopped", {"state": self.state, **self.counters})
        self.events.close()
        self.spool_io.shutdown(wait=True)
        self.heartbeat_io.shutdown(wait=True)
        if self.lease_lost:
            return EXIT_LEASE_LOST
        if self.fatal is not None:
            log.error("worker %s exits: %s", self.worker_id, self.fatal)
            return 1
        return 0

    async def _in_spool_io(self, call: Any, *args: Any) -> Any:
        # The calling task's fsops duty goes with the call into the thread.
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self.spool_io, context.run, call, *args)

    def _lose_lease(self, how: str) -> None:
        """Our claims were taken over (we were paused, partitioned or suspended past the lease).

        Everything this worker holds is somebody else's now: say so, write nothing for those
        jobs, close their sandboxes, and stop; main.py starts a fresh worker in this process.
        """
        if self.lease_lost:
            return
        self.lease_lost = how
        dropped = self.shards.pending + len(self.committing)
        log.error("worker %s lost its lease (%s): its claims were returned to the queues by another worker; "
                  "dropping %d buffered row(s) and %d running stage(s), then re-registering",
                  self.worker_id, how, dropped, len(self.running))
        self.events.emit("-", "lease_lost", {"how": how, "dropped_rows": dropped, "running": len(self.running)})
        self.request_stop(0.0)

    def request_stop(self, grace_s: float | None = None) -> None:
        """Stop claiming; finish running stages within `grace_s`, then return what is left."""
        if grace_s is not None:
            self.grace_s = min(self.grace_s, grace_s) if self.stopping.is_set() else grace_s
        elif self.stopping.is_set():
            self.grace_s = 0.0  # asked twice: stop now
        self.stopping.set()

    def _essential_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or self.stopping.is_set():
            return
        exc = task.exception()
        self.fatal = exc or RuntimeError(f"{task.get_name()} ended unexpectedly")
        log.error("essential part %s of worker %s failed: %r", task.get_name(), self.worker_id, self.fatal)
        self.request_stop(0.0)

    async def _drain(self) -> None:
        """Give back prepared jobs, let running stages finish within the grace period."""
        self._return_prepared()
        self._evaluate_waiting()
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and self.grace_s > 0:
            self._evaluate_own_runs()
            if not self.running:
                break
            await asyncio.sleep(0.05)
        for task, _ in list(self.running.values()):
            task.cancel()
        pending = [task for task, _ in self.running.values()]
        await asyncio.gather(*pending, return_exceptions=True)

    def _evaluate_own_runs(self) -> None:
        """While draining, jobs whose RUN just finished here are evaluated here too, not left queued."""
        if Stage.EVAL not in self.options.stages or self.lease_lost:
            return
        for name, ticket in list(self.written.items()):
            if ticket.stage is Stage.EVAL and fsops.rename(self.paths.eval_queue / name, self.box.dir / name):
                self._start(Stage.EVAL, name, holds_slot=False)

    def _evaluate_waiting(self) -> None:
        """While draining, jobs waiting here for an EVAL slot go to queue/eval with their RUN
        output, attempt unchanged (their RUN went well): evaluated here within the grace period as
        this worker's own runs are, else by whoever claims them. Started here instead, a stop
        without grace would cancel them before their first step and charge them an attempt."""
        waiting, self.waiting_eval = self.waiting_eval, {}
        if self.lease_lost:
            return   # their claims are another worker's now
        for ticket in waiting.values():
            self._advance(ticket, Stage.EVAL)

    def _return_prepared(self) -> None:
        """Jobs this worker prepared but nobody started: their sandboxes die with us, so back to INIT."""
        self._return_waiting()
        for name in list(self.prepared):
            ticket = self.prepared.pop(name)
            asyncio.get_running_loop().create_task(self._close_quietly(ticket))
            if self.lease_lost:
                continue  # its claim is another worker's now
            ticket.back_to_init()
            self._move_out(ticket, self.paths.init_queue)
            self.events.emit(name, "returned", {"stage": "run", "to": "init"})
        for name in list(self.written):
            ticket = self.written.pop(name)
            if ticket.stage is not Stage.RUN or ticket.status is not None:
                continue
            # Not claimed by us (it waits in the run queue): fenced or not, it may go back.
            holding = self.paths.tmp / f".return-{name}"
            if not fsops.rename(self.run_queue / name, holding):
                continue  # already claimed by someone
            asyncio.get_running_loop().create_task(self._close_quietly(ticket))
            ticket.back_to_init()
            fsops.write_atomic(self.paths.init_queue / name, ticket.encode(), self.paths.tmp)
            fsops.unlink(holding)
            self.events.emit(name, "returned", {"stage": "run", "to": "init"})

    def _return_waiting(self) -> None:
        """Jobs of held batches that never started go back unchanged: a batch none of whose jobs
        started goes back whole (one rename), the others one ticket each."""
        waiting, self.waiting_init = self.waiting_init, {}
        if self.lease_lost:
            return
        by_batch: dict[str, list[Ticket]] = {}
        for ticket in waiting.values():
            by_batch.setdefault(self.batches.held.batch_of(ticket.name) or "", []).append(ticket)
        for name, tickets in by_batch.items():
            if name and self.batches.give_back_whole(name, self.paths.init_queue):
                continue
            for ticket in tickets:
                try:
                    self._move_out(ticket, self.paths.init_queue)
                except OSError as exc:   # a full spool: the batch file still holds it, returned at the end
                    log.warning("job %s: could not give it back (%s); its batch goes back with the claims", ticket.name, exc)

    def _move_out(self, ticket: Ticket, queue: Any) -> None:
        """Save the ticket and hand it to `queue` (ClaimBox.advance). A job of a held batch leaves
        as its own ticket: written here first, recorded in the hand-off log, then renamed, so
        that recovery finds it exactly once whatever moment a crash comes (orchestrator/spool/handoffs.py)."""
        if self.batches.holds(ticket.name):
            self.batches.leave(ticket, queue)
        else:
            self.box.advance(ticket, queue)

    def _quarantined(self, name: str, reason: str) -> None:
        self.events.emit(name, "quarantined", {"reason": reason})

    def _registry_quarantined(self, reason: str) -> None:
        self.events.emit("-", "registry_quarantined", {"reason": reason})

    def _take_batch(self, name: str) -> bool:
        """A batch file just claimed here: its jobs wait in memory for INIT slots. False when corrupt
        (quarantined, never deleted)."""
        tickets = self.batches.take(name)
        if tickets is None:
            self.events.emit("-", "batch_quarantined", {"batch": name})
            return False
        for ticket in tickets:
            self.waiting_init[ticket.name] = ticket
        self.wake[Stage.INIT].set()
        return True

    def _start_waiting(self, holds_slot: bool, name: str | None = None) -> None:
        name = name or next(iter(self.waiting_init))
        ticket = self.waiting_init.pop(name)
        self.batches.held.mark_started(name)
        self._start(Stage.INIT, name, holds_slot=holds_slot, ticket=ticket)

    async def _close_quietly(self, ticket: Ticket) -> None:
        ctx = self._context(ticket, Stage.RUN)
        try:
            await ctx.close_runtime()
        except Exception as exc:
            log.warning("closing the sandbox of %s: %s", ticket.name, exc)

    # -- periodic duties ---------------------------------------------------------------------
    def _poll_period(self, small_run_s: float, large_run_s: float) -> float:
        return small_run_s if self.cluster_workers <= LARGE_RUN_WORKERS else large_run_s

    def _request_poll_period(self, small_run_s: float, large_run_s: float) -> float:
        """cancel/ and control/stop: a large run with a fresh cluster summary finds them there, in
        memory, so it looks as often as a small run polls; without one, every large_run_s."""
        if self.cluster.fresh() is not None:
            return small_run_s
        return self._poll_period(small_run_s, large_run_s)

    def _idle_backoff_floor(self) -> float:
        return self._poll_period(MIN_IDLE_BACKOFF_S, MIN_IDLE_BACKOFF_LARGE_S)

    def _idle_backoff_cap(self) -> float:
        return self._poll_period(MAX_IDLE_BACKOFF_S, MAX_IDLE_BACKOFF_LARGE_S)

    def _may_hold_work(self, stage: Stage, unpolled_s: float) -> bool:
        """Whether a dispatcher with a free slot should ask the spool for a ticket: always on small
        runs; on a large one after work of this worker's own (its wake-up is set, or it hinted a
        name), when the cluster summary says the queue may hold a ticket, or after a long while."""
        summary = self.cluster.fresh()
        if summary is None or unpolled_s >= UNHINTED_POLL_LARGE_S:
            return True
        own_work_queued = self.wake[stage].is_set() and not (stage is Stage.RUN and self._keeps_prepared())
        if own_work_queued or self.claimers[stage].hinted:   # (jobs prepared here wait in memory, not in the queue)
            return True
        return _summary_hints_work(summary, self._queue_of(stage).name, self.node)

    def _count_workers(self, heartbeats: int) -> None:
        self.cluster_workers = heartbeats
        for stage in (Stage.INIT, Stage.EVAL):   # the shared queues: every worker claims there
            self.claimers[stage].claimers = heartbeats

    def _background(self, name: str, period: float | Callable[[], float], duty: Any) -> asyncio.Task[None]:
        """A periodic duty as its own task; its metadata operations are charged to `name`."""
        async def run() -> None:
            with fsops.duty(name):
                await self._every(period, duty)
        return asyncio.create_task(run(), name=name.replace("_", "-"))

    async def _every(self, period: float | Callable[[], float], duty: Any) -> None:
        """Run `duty` every `period` (a number, or a function giving the next wait); a spool error
        (full, failing) is retried next time, not fatal."""
        failures = 0
        while True:
            wait = period() if callable(period) else period
            await asyncio.sleep(wait)
            try:
                done = duty()
                if asyncio.iscoroutine(done):
                    await done
                failures = 0
            except OSError as exc:
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.warning("%s failed (%d time(s) in a row): %s; retrying every %.1fs",
                                getattr(duty, "__name__", duty), failures, exc, wait)

    def _heartbeat_record(self) -> dict[str, Any]:
        pools = {s.value: {"busy": self.busy[s], "size": self.options.pool_size(s)} for s in Stage}
        return {
            **self.info, "state": self.state, "pools": pools, "counters": self.counters,
            "prepared": len(self.prepared), "waiting_init": len(self.waiting_init),
            "waiting_eval": len(self.waiting_eval),
            "buffered_rows": self.shards.pending + len(self.committing), "fs_ops": dict(fsops.OPS),
            "fs_ops_by_duty": dict(fsops.BY_DUTY),
            "shards": self.shards.progress(),
            **({"load": router.board.counts()} if (router := self.services.llm_router) is not None else {}),
        }

    def _heartbeat(self) -> None:
        info = self._heartbeat_record()
        write_heartbeat(self.paths, self.worker_id, info)
        self._write_metrics(info)

    def _write_metrics(self, info: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write({**info, "heartbeat_at": time.time()})

    def _beat_if_still_ours(self, record: dict[str, Any]) -> bool:
        """Refresh the lease, unless recovery has taken our claim directory (then False).

        On a full spool the record cannot be rewritten, but its mtime (the lease) can still be
        refreshed: a full disk must not make every worker look dead.
        """
        if fsops.mtime(self.box.dir) is None:
            return False
        try:
            write_heartbeat(self.paths, self.worker_id, record)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            fsops.touch(self.paths.heartbeat(self.worker_id))
            return True
        self._write_metrics(record)
        return True

    async def _heartbeat_checked(self) -> None:
        if self.lease_lost:
            return
        if self.services.llm_router is not None:   # in-flight counts held back on a large run (its
            self.services.llm_router.board.publish_if_due()   # tasks run long: no new pick publishes)
        self._expire_cache()
        loop = asyncio.get_running_loop()
        for attempt in range(HEARTBEAT_FAILURES_FATAL):
            try:
                held = await loop.run_in_executor(self.heartbeat_io, contextvars.copy_context().run,
                                                  self._beat_if_still_ours, self._heartbeat_record())
            except OSError as exc:
                log.warning("heartbeat failed (%d/%d): %s", attempt + 1, HEARTBEAT_FAILURES_FATAL, exc)
                await asyncio.sleep(0.2)
                continue
            if not held:
                self._lose_lease(f"its claim directory {self.box.dir} was taken over")
            return
        raise RuntimeError(f"spool unreachable: cannot write {self.paths.heartbeat(self.worker_id)}")

    async def _recover(self) -> None:
        if self.lease_lost or self.cluster.fresh() is not None:
            return   # a large run: the summary's rebuilder finds the dead workers (_refresh_cluster_view)
        moved = await self._in_spool_io(reap_expired, self.paths, self.worker_id, self.config.leases.lease_s,
                                        self.config.jobs.max_attempts, self.events.emit, None, self._count_workers)
        if moved:
            self.counters["requeued"] += moved
            for stage in Stage:
                self.wake[stage].set()

    async def _refresh_cluster_view(self) -> None:
        """Large runs: re-read the cluster summary when a newer one may exist (rebuild it when due,
        and then return the dead workers' claims it found); small runs: nothing."""
        if self.lease_lost or self.cluster_workers <= LARGE_RUN_WORKERS:
            return
        moved = await self._in_spool_io(self._read_cluster_view)
        summary = self.cluster.fresh()
        if summary is not None:
            self._count_workers(summary.alive)
        if moved:
            self.counters["requeued"] += moved
            for stage in Stage:
                self.wake[stage].set()

    def _read_cluster_view(self) -> int:
        rebuilt = self.cluster.refresh(recover=lambda found: reap_found(
            self.paths, self.worker_id, self.config.leases.lease_s, self.config.jobs.max_attempts,
            self.events.emit, found))
        return rebuilt.moved if rebuilt is not None else 0

    def _poll_cancels(self) -> None:
        before = self.cancels.signature()
        summary = self.cluster.fresh()
        if summary is not None:   # a large run: cancel/ as the summary's rebuilder listed it
            self.cancels.apply(summary.cancel_names, summary.cancel_all_before)
        else:
            self.cancels.refresh()
        now = time.monotonic()
        if self.cancels.signature() != before or now - self.cancel_swept_at > CANCEL_SWEEP_S:
            self.cancel_swept_at = now
            self._sweep_cancelled_queued()
        for name, ticket in list(self.waiting_init.items()):
            if self.cancels.is_cancelled(ticket.job):   # a job of a held batch: it ends now
                self._start_waiting(holds_slot=False, name=name)
        for name, ticket in list(self.prepared.items()):
            if self.cancels.is_cancelled(ticket.job):   # it ends now, its sandbox closed
                del self.prepared[name]
                self.wake[Stage.INIT].set()
                self._start(Stage.RUN, name, holds_slot=False, ticket=ticket)
        for name, ticket in list(self.waiting_eval.items()):
            if self.cancels.is_cancelled(ticket.job):   # it ends now, without its EVAL
                del self.waiting_eval[name]
                self._start(Stage.EVAL, name, holds_slot=False, ticket=ticket)
        for job_id, (task, _) in list(self.running.items()):
            if job_id not in self.user_cancelled and self._is_cancelled(job_id):
                self.user_cancelled.add(job_id)
                task.cancel()

    def _sweep_cancelled_queued(self) -> None:
        """Cancelled jobs still waiting in a queue end now, not when a slot would free up."""
        if not (self.cancels.jobs or self.cancels.groups or self.cancels.all_before):
            return
        queues = [(s, self._queue_of(s)) for s in Stage if s in self.options.stages]
        for stage, queue in queues:
            for name in fsops.list_names(queue):
                if is_batch(name) and self.stopping.is_set():
                    continue   # its other jobs would only go back: leave it to a worker that stays
                if self.cancels.matches_name(name) and fsops.rename(queue / name, self.box.dir / name):
                    if is_batch(name):   # its jobs wait here; the cancelled ones end at once (below)
                        self._take_batch(name)
                    else:
                        self._start(stage, name, holds_slot=False)

    def _is_cancelled(self, job_id: str) -> bool:
        ticket = self._tickets_in_flight.get(job_id)
        return ticket is not None and self.cancels.is_cancelled(ticket.job)

    def _poll_stop_request(self) -> None:
        summary = self.cluster.fresh()
        requested = summary.stop_at if summary is not None else fsops.mtime(self.paths.stop_request)
        if requested is not None and requested >= self.started_at:
            log.info("stop requested through %s", self.paths.stop_request)
            self.request_stop()

    def _exit_if_idle(self) -> None:
        # Jobs prepared on this node wait in its run queue, which the idle clock lists at the deadline.
        holding = bool(self.running) or bool(self.prepared) or bool(self.waiting_init) or bool(self.waiting_eval) \
            or self.shards.pending > 0
        if self.idle.expired(holding, [self._queue_of(s) for s in self.options.stages], self.counters["claimed"]):
            log.info("worker %s: idle for %.1fs, giving its node back", self.worker_id, self.idle.idle_for())
            self.events.emit("-", "idle_exit", {"idle_s": round(self.idle.idle_for(), 3)})
            self.request_stop()

    def _sweep_in_background(self) -> None:
        # Killing a stubborn sandbox may take seconds: keep the event loop (and heartbeats) going.
        asyncio.get_running_loop().run_in_executor(None, self._sweep_sandboxes)

    def _sweep_sandboxes(self) -> None:
        from orchestrator.sandbox.start import sweep_orphaned_sandboxes

        try:
            reaped = sweep_orphaned_sandboxes()
            if reaped:
                self.events.emit("-", "sandboxes_reaped", {"count": reaped})
        except Exception as exc:  # the sweep is hygiene: never let it stop the worker
            log.warning("sandbox sweep failed: %s", exc)

    async def _commit_shards_if_due(self) -> None:
        if time.monotonic() >= self.commit_retry_at and (
                self.settling is not None or self.shards.due(idle=self.busy[Stage.EVAL] == 0)):
            await self._commit_shards()

    async def _commit_shards(self) -> None:
        """Write the buffered rows as a shard (in the spool thread), then drop their tickets.

        Once the shard is renamed into shards/ its rows are committed: no error after that puts
        them back (they would be written twice). Its claims are dropped by `_settle`, retried
        until it succeeds before any further shard; recovery finds the rows of any claim left."""
        if self.lease_lost or (self.settling is not None and not await self._settle()):
            return
        batch = self.shards.take()
        if batch is None:
            return
        self.committing = batch.tickets
        cleanup = [name for name in batch.tickets if name in self.workspaces_to_remove]
        try:
            flushed = True
            try:
                await self._in_spool_io(self.shards.write, batch, self.box.dir)
            except UnflushedShard as exc:
                log.warning("%s; its claims are dropped once a flush succeeds", exc)
                flushed = False
            self.settling = Settling(batch.tickets, self.shards.last_seq, cleanup, flushed)
        except FencedOut as exc:
            self._lose_lease(str(exc))
            return
        except OSError as exc:  # full or failing spool, nothing renamed in: keep the rows, hold the claims, retry
            self.shards.put_back(batch)
            delay = self._commit_failed()
            log.warning("cannot commit %d row(s) to %s (%s); retrying in %.1fs", len(batch.rows), self.paths.shards, exc, delay)
            return
        finally:
            self.committing = []
        self.counters["poisoned"] = self.shards.poisoned
        await self._settle()

    def _commit_failed(self) -> float:
        """Back off the next commit try; the delay."""
        self.commit_failures += 1
        delay = min(COMMIT_RETRY_S[0] * 2 ** (self.commit_failures - 1), COMMIT_RETRY_S[1])
        self.commit_retry_at = time.monotonic() + delay
        return delay

    async def _settle(self) -> bool:
        """Drop the claims of the committed shard `self.settling`; False (retried later) on an error."""
        settling = self.settling
        assert settling is not None
        try:
            await self._in_spool_io(self._drop_committed, settling)
        except OSError as exc:
            delay = self._commit_failed()
            log.warning("shard %d is committed, but dropping its %d claim(s) failed (%s); retrying in %.1fs",
                        settling.shard_seq, len(settling.tickets), exc, delay)
            return False
        self.settling = None
        self.commit_failures = 0
        self.workspaces_to_remove.difference_update(settling.remove_workspaces_of)
        return True

    def _drop_committed(self, settling: Settling) -> None:
        if not settling.flushed:
            fsops.sync_dir(self.paths.shards)  # the shard's name is durable before its tickets are dropped
        self.batches.committed(settling.tickets, settling.shard_seq)
        self.batches.drop_emptied()
        for name in settling.remove_workspaces_of:  # the row is durable: the job's scratch space can go
            for workspace in removable_workspaces(self.paths.job_dir(name)):
                shutil.rmtree(workspace, ignore_errors=True)

    async def _audit_claims(self) -> None:
        """Claims no part of this worker is carrying (a bug, an error while giving one back) are
        requeued once seen twice in a row: a claim must never sit here forever."""
        if self.lease_lost or self.stopping.is_set():
            return
        held = set(await self._in_spool_io(self.box.names))
        carried = set(self.running) | set(self.prepared) | set(self.waiting_init) | set(self.waiting_eval) \
            | set(self.shards.tickets) | set(self.committing) | set(self.settling.tickets if self.settling else ())
        in_batches = self.batches.held.unresolved_jobs()   # their own files too: they leave the batch's way
        strays = (held - carried - self.batches.held.names() - self.batches.emptied - in_batches) | (in_batches - carried)
        for name in strays & self.stray_claims:
            self._requeue_claim(name, "claim held by no task of its worker")
        self.stray_claims = strays - self.stray_claims

    def _requeue_claim(self, name: str, reason: str) -> None:
        if self.batches.holds(name):   # a job of a held batch: it leaves as its own ticket
            ticket = self._tickets_in_flight.get(name) or self.waiting_init.pop(name, None) \
                or self.batches.held.ticket(name)
            try:
                if ticket is None:
                    raise FileNotFoundError(f"no ticket of job {name} in memory")
                self.batches.leave_by_requeue(ticket)
            except OSError as exc:   # a full spool, say: the batch still holds it, the audit retries
                log.error("job %s: could not requeue it out of its batch (%s); the claim audit will try again", name, exc)
                return
        try:
            moved = requeue_claim(self.paths, self.box.dir / name, f"{reason} (worker {self.worker_id})",
                                  self.config.jobs.max_attempts, self.events.emit, self.journal.entries())
        except FileNotFoundError:
            return  # moved on meanwhile
        except OSError as exc:
            log.error("job %s: could not requeue its claim (%s); the claim audit will try again", name, exc)
            return
        self.counters["requeued"] += moved
        self.claimers[Stage.INIT].forget()

    # -- dispatching ---------------------------------------------------------------------------
    def _queue_of(self, stage: Stage) -> Any:
        return {Stage.INIT: self.paths.init_queue, Stage.RUN: self.run_queue, Stage.EVAL: self.paths.eval_queue}[stage]

    async def _dispatch(self, stage: Stage) -> None:
        claimer = self.claimers[stage]
        backoff = self._idle_backoff_floor()
        polled_at = time.monotonic()   # the last claim that asked the spool
        # Checked, not only cancelled: Python 3.11's wait_for swallows a cancellation that lands
        # as the awaited event is set, and the dispatcher would claim on after a stop.
        while not self.stopping.is_set():
            await self.slots[stage].acquire()
            if stage is Stage.INIT:
                await self._wait_for_room()
            if self.stopping.is_set():
                self.slots[stage].release()
                return
            if stage is Stage.INIT and self.waiting_init:   # a job of a batch claimed here
                self._start_waiting(holds_slot=True)
                continue
            if stage is Stage.EVAL and self.waiting_eval:   # RUN done here: already claimed, output journaled
                name = next(iter(self.waiting_eval))
                self._start(stage, name, holds_slot=True, ticket=self.waiting_eval.pop(name))
                if not self.waiting_eval and not claimer.hinted:
                    self.wake[stage].clear()   # it was for these jobs: no queue to ask for them
                continue
            if stage is Stage.RUN and self.prepared:   # prepared here: already claimed, sandbox up
                name = next(iter(self.prepared))
                ticket = self.prepared.pop(name)
                self.wake[Stage.INIT].set()
                self._start(stage, name, holds_slot=True, ticket=ticket)
                continue
            name = None
            if self._may_hold_work(stage, time.monotonic() - polled_at):
                polled_at = time.monotonic()
                try:
                    name = claimer.claim()
                except OSError as exc:  # the spool failing for a moment: try again later, slot freed
                    log.warning("claiming from %s failed: %s", claimer.queue, exc)
            if name is None:
                self.slots[stage].release()
                while True:
                    self.wake[stage].clear()
                    try:
                        await asyncio.wait_for(self.wake[stage].wait(), timeout=backoff)
                        backoff = self._idle_backoff_floor()  # woken by work of our own
                        break
                    except asyncio.TimeoutError:
                        backoff = min(backoff * 2, self._idle_backoff_cap())
                    if self.stopping.is_set() or self._may_hold_work(stage, time.monotonic() - polled_at):
                        break
                continue
            backoff = self._idle_backoff_floor()
            if is_batch(name):
                if stage is Stage.INIT and self._take_batch(name):
                    self._start_waiting(holds_slot=True)
                else:   # corrupt (quarantined), or a batch where only single tickets go (quarantined)
                    if stage is not Stage.INIT:
                        fsops.quarantine(self.box.dir / name, self.paths.quarantine,
                                         f"a batch file in {claimer.queue.name}: batches are queued in queue/init only")
                    self.slots[stage].release()
                continue
            if stage is Stage.RUN:
                self.prepared_seen = max(0, self.prepared_seen - 1)
                self.wake[Stage.INIT].set()
            self._start(stage, name, holds_slot=True)

    def _start(self, stage: Stage, name: str, holds_slot: bool, ticket: Ticket | None = None) -> None:
        self.counters["claimed"] += 1
        self.busy[stage] += 1
        task = asyncio.create_task(self._process(stage, name, ticket), name=f"{stage.value}:{name}")
        self.running[name] = (task, stage)
        task.add_done_callback(lambda done: self._slot_done(stage, name, holds_slot, done))

    def _slot_done(self, stage: Stage, name: str, holds_slot: bool, task: asyncio.Task[None]) -> None:
        self.busy[stage] -= 1
        if self.running.get(name, (None,))[0] is task:  # not yet handed to its next stage here
            self.running.pop(name, None)
            self._tickets_in_flight.pop(name, None)
            self.user_cancelled.discard(name)
        if holds_slot:
            self.slots[stage].release()

    async def _hand_off(self, ticket: Ticket, stage: Stage) -> bool:
        """Go on with `stage` in this process when one of its slots is free.

        Skips a queue round trip (a rename out, a rename back in, a race with other
        workers). INIT -> RUN needs no write at all: should this worker die, recovery sends
        the job back to INIT either way. RUN -> EVAL journals the RUN output first (a data
        append, not a ticket rewrite): a crash during EVAL then resumes at EVAL elsewhere.
        """
        if stage not in self.options.stages or self.stopping.is_set() or self.slots[stage].locked():
            return False
        await self.slots[stage].acquire()  # free: returns at once
        ticket.mark_enqueued(stage)
        if stage is Stage.EVAL:
            try:
                self._journal_run_output(ticket)
            except BaseException:  # a full spool, say: the slot must not leak with the error
                self.slots[stage].release()
                raise
        # The claim file still holds the ticket as claimed: the stage gets it from memory.
        self._start(stage, ticket.name, holds_slot=True, ticket=ticket)
        return True

    def _journal_run_output(self, ticket: Ticket) -> None:
        """Append what a ticket save would have written; rotate once the journal is large
        (its obsolete entries are those of jobs no longer claimed: committed, handed on; a job
        of a held batch has no claim file of its own, its batch file stands for it)."""
        self.journal.append(JournalEntry(RecordKind.RUN_OUTPUT, ticket.name, ticket.attempt, ticket.progress()))
        if self.journal.due():
            claimed = set(self.box.names())
            live = {job for job in self.journal.entries() if job in claimed or self.batches.held.batch_of(job) is not None}
            try:
                self.journal.rotate(live)
            except OSError as exc:   # the record is safe; the journal only grows until the next try
                log.warning("rotating the journal %s failed: %s", self.journal.path, exc)

    def _keeps_for_eval(self) -> bool:
        """Room for one more job to wait here for an EVAL slot (see waiting_eval)."""
        return (Stage.EVAL in self.options.stages and not self.stopping.is_set()
                and len(self.waiting_eval) < self.options.pool_size(Stage.EVAL))

    def _keep_for_eval(self, ticket: Ticket) -> None:
        """Every EVAL slot is busy: the job waits here for one. Its RUN output is journaled first,
        so a crash meanwhile resumes it at EVAL elsewhere, as the eval queue would. The wake-up
        matters when the EVAL dispatcher sleeps after an empty claim (in-place hand-offs filled
        its slots meanwhile): on a large run nothing else would wake it for up to 30 s."""
        ticket.mark_enqueued(Stage.EVAL)
        self._journal_run_output(ticket)
        self.waiting_eval[ticket.name] = ticket
        self.wake[Stage.EVAL].set()
        self.events.emit(ticket.name, "eval_waiting", {"waiting": len(self.waiting_eval)})

    def _keeps_prepared(self) -> bool:
        """This worker runs what it prepares (it has RUN slots), so prepared jobs wait in memory."""
        return self.options.pool_size(Stage.RUN) > 0 and Stage.RUN in self.options.stages

    def _keep_prepared(self, ticket: Ticket) -> None:
        """Every RUN slot is busy: the job waits here for one. Nothing is written: a crash sends
        its claim (still saying INIT) back to INIT, exactly as the node's run queue would."""
        if self.stopping.is_set():
            self._advance(ticket, Stage.RUN)   # the drain returns it from the run queue
            return
        ticket.mark_enqueued(Stage.RUN)
        self.prepared[ticket.name] = ticket
        self.wake[Stage.RUN].set()

    async def _wait_for_room(self) -> None:
        """Backpressure: INIT waits while the node's run queue (and the sandbox budget) is full."""
        options = self.options
        while True:
            prepared = self._prepared_count()
            in_progress = self.busy[Stage.INIT]
            room = prepared + in_progress < int(options.max_prepared or 0) or not options.max_prepared
            if options.max_sandboxes:
                room = room and in_progress + prepared + self.busy[Stage.RUN] < options.max_sandboxes
            if room:
                return
            self.wake[Stage.INIT].clear()
            try:
                await asyncio.wait_for(self.wake[Stage.INIT].wait(), timeout=0.05)
            except asyncio.TimeoutError:
                pass

    def _prepared_count(self) -> int:
        if self._keeps_prepared():
            return len(self.prepared)   # known exactly: nothing to list
        now = time.monotonic()
        if now - self.prepared_seen_at > 0.1:
            with fsops.duty("backpressure"):
                self.prepared_seen = len(fsops.list_names(self.run_queue))
            self.prepared_seen_at = now
        return self.prepared_seen

    # -- one stage of one job ----------------------------------------------------------------
    def _context(self, ticket: Ticket, stage: Stage) -> JobContext:
        return JobContext(job=ticket.job, stage=stage, attempt=ticket.attempt, services=self.services, state=ticket.state)

    def _handler(self, name: str) -> AgentHandler:
        handler = self.handlers.get(name)
        if handler is None:
            handler = self.handlers[name] = load_handler(name)
        return handler

    def _cached(self, name: str, stage: Stage) -> Ticket | None:
        """The ticket as this worker last wrote it, if that is still what the claim holds.

        A ticket that went to another worker and came back (returned to INIT, say) has another
        stage than the one we wrote, and is read from disk again.
        """
        ticket = self.written.pop(name, None)
        if ticket is None or ticket.stage is not stage or time.time() - ticket.enqueued_at > CACHE_TRUST_S:
            return None
        return ticket

    def _expire_cache(self) -> None:
        horizon = time.time() - CACHE_TRUST_S
        for name in [n for n, t in self.written.items() if t.enqueued_at < horizon]:
            del self.written[name]

    async def _process(self, stage: Stage, name: str, ticket: Ticket | None = None) -> None:
        try:
            await self._run_stage(stage, name, ticket)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or a spool error: the claim must not stay here
            await self._engine_error(stage, name, exc)

    async def _engine_error(self, stage: Stage, name: str, exc: Exception) -> None:
        if not self.lease_lost and fsops.mtime(self.box.dir) is None:
            self._lose_lease(f"{type(exc).__name__} while carrying job {name}: its claim directory is gone")
        if self.lease_lost:
            log.info("job %s: %s after this worker lost its lease; left to its new owner", name, exc)
            return
        log.error("job %s: worker error in %s: %s: %s", name, stage.value, type(exc).__name__, exc, exc_info=exc)
        ticket = self._tickets_in_flight.get(name)
        if ticket is not None and "sandbox" in ticket.state:
            await self._close_quietly(ticket)
        if name in self.shards.tickets or name in self.committing or (self.settling and name in self.settling.tickets):
            return  # its row is on its way: the ticket goes with the shard
        self._requeue_claim(name, f"worker error in {stage.value}: {type(exc).__name__}: {exc}")

    async def _run_stage(self, stage: Stage, name: str, ticket: Ticket | None = None) -> None:
        ticket = ticket or self._cached(name, stage) or self.box.load(name)
        if ticket is None:
            return  # corrupt: quarantined by load()
        self._tickets_in_flight[name] = ticket
        now = time.time()
        ticket.add_queue_time(now)
        ticket.history.append({"t": now, "stage": stage.value, "worker": self.worker_id, "attempt": ticket.attempt})
        if ticket.status is not None:        # failed or cancelled earlier: only the row is left
            self._finish(ticket, None, None)
            return
        handler, ctx = None, self._context(ticket, stage)
        try:
            handler = self._handler(ticket.job.handler)
        except HandlerError as exc:
            await self._end_early(ticket, ctx, JobStatus.FAILED, StageError(stage.value, "HandlerError", str(exc)), {})
            return
        if self.cancels.is_cancelled(ticket.job):
            await self._end_early(ticket, ctx, JobStatus.CANCELLED, StageError(stage.value, "cancelled", "cancelled before it started"), {})
            return
        if stage is Stage.INIT and (refusal := self._sandbox_refusal(handler, ticket)):
            await self._end_early(ticket, ctx, JobStatus.FAILED, StageError(stage.value, "SandboxPolicyError", refusal), {})
            return
        budget = self.config.jobs.timeout_s - ticket.counted_s()
        previous = ticket.outputs.get({Stage.RUN: "init", Stage.EVAL: "run"}.get(stage, ""), {}) or {}
        if stage is Stage.EVAL and (stale := self._stale(previous)):
            await self._end_early(ticket, ctx, JobStatus.CANCELLED, StageError(stage.value, STALE_KIND, stale), {})
            return
        self.events.emit(name, f"{stage.value}_started", {"attempt": ticket.attempt})
        started, started_mono = time.time(), time.monotonic()
        if stage is Stage.RUN:
            ticket.timings["run_started_at"] = started
        try:
            outcome = await execute_stage(handler, ctx, previous, budget, lambda: name in self.user_cancelled)
        except asyncio.CancelledError:
            ticket.timings[f"{stage.value}_s"] = ticket.timings.get(f"{stage.value}_s", 0.0) + time.monotonic() - started_mono
            await self._give_back(ticket, ctx, stage)
            raise
        finally:
            if stage is Stage.RUN:  # the runtime closes right after RUN, before EVAL
                await self._close_runtime(ctx)
        elapsed = time.monotonic() - started_mono
        ticket.timings[f"{stage.value}_s"] = ticket.timings.get(f"{stage.value}_s", 0.0) + elapsed
        if stage is Stage.RUN:
            ticket.timings["run_ended_at"] = time.time()
        ticket.record_output(stage, outcome.output)
        self.events.emit(name, f"{stage.value}_finished", {"s": round(elapsed, 6), **({"status": outcome.status.value} if outcome.status else {})})
        if outcome.error is not None and outcome.error.traceback:
            self.events.emit(name, "stage_failed", {"stage": stage.value, "error": outcome.error.as_text(),
                                                    "traceback": outcome.error.traceback})
        if stage is Stage.RUN and outcome.error is not None and outcome.error.kind == "SandboxAttachError":
            # The sandbox INIT prepared died with the worker that started it: prepare it again.
            self._requeue_claim(name, f"its sandbox is gone: {outcome.error.message}")
        elif outcome.status is not None and stage is not Stage.EVAL:
            await self._end_early(ticket, ctx, outcome.status, outcome.error, outcome.output)
        elif stage is Stage.INIT:
            ticket.node = self.node
            if not await self._hand_off(ticket, Stage.RUN):
                if self._keeps_prepared():
                    self._keep_prepared(ticket)
                else:
                    self._advance(ticket, Stage.RUN)
        elif stage is Stage.RUN:
            if not await self._hand_off(ticket, Stage.EVAL):
                if self._keeps_for_eval():
                    self._keep_for_eval(ticket)
                else:
                    self._advance(ticket, Stage.EVAL)
        else:
            self._finish(ticket, handler, outcome.error, ctx, outcome.status)

    def _sandbox_refusal(self, handler: AgentHandler, ticket: Ticket) -> str | None:
        """Why the run's sandbox policy refuses what the job's row asks for, before INIT runs any of
        it (a ticket planted without `submit`); None: allowed, or left to INIT, which checks again."""
        try:
            self.services.sandbox_policy.decide(self.services.sandbox_defaults, handler.sandbox_request(ticket.job.instance),
                                                handler=ticket.job.handler, job_dir=self.paths.job_dir(ticket.name))
        except SandboxPolicyError as exc:
            return str(exc)
        except Exception:  # a row the handler cannot read: INIT fails with the handler's own reason  # noqa: BLE001
            return None
        return None

    def _stale(self, run_output: dict[str, Any]) -> str | None:
        """Why evaluating this RUN output is pointless: its samples are too old (None: go on)."""
        oldest = run_output.get("policy_version_min")
        if not isinstance(oldest, int):
            return None
        try:
            floor = self.registry.read().min_policy_version
        except Exception:  # an unreadable registry must not stop evaluation  # noqa: BLE001
            return None
        return stale_reason(oldest, floor)

    async def _close_runtime(self, ctx: JobContext) -> None:
        try:
            await asyncio.shield(ctx.close_runtime())
        except Exception as exc:
            log.warning("closing the runtime of %s failed: %s", ctx.job.job_id, exc)

    def _advance(self, ticket: Ticket, stage: Stage) -> None:
        ticket.mark_enqueued(stage)
        self._move_out(ticket, self._queue_of(stage))
        if stage is Stage.RUN:
            self.prepared_seen += 1  # counted now; the periodic listing corrects it
        self.written[ticket.name] = ticket
        self.claimers[stage].hint(ticket.name)
        self.wake[stage].set()
        self.wake[Stage.INIT].set()

    async def _end_early(self, ticket: Ticket, ctx: JobContext, status: JobStatus, error: StageError | None, output: dict[str, Any]) -> None:
        """A job that failed, timed out or was cancelled before EVAL: close it, send it to its row."""
        await self._close_runtime(ctx)
        ticket.end_early(status, error.to_record() if error is not None else None, ctx.stage, output)
        if Stage.EVAL in self.options.stages:
            self._finish(ticket, self.handlers.get(ticket.job.handler), error, ctx, status)
        else:
            self._advance(ticket, Stage.EVAL)

    def _finish(self, ticket: Ticket, handler: AgentHandler | None, error: StageError | None,
                ctx: JobContext | None = None, status: JobStatus | None = None) -> None:
        """Buffer the job's row; its ticket is dropped once the shard holding the row is committed."""
        if self.lease_lost:
            return  # the claim is another worker's now
        status = ticket.status or status or JobStatus.OK
        if error is None and ticket.error:
            error = StageError.from_record(ticket.error)
        if error is not None:
            ticket.keep_error(error.to_record())
        if handler is None:
            try:
                handler = self._handler(ticket.job.handler)
            except HandlerError:
                handler = None
        ctx = ctx or self._context(ticket, Stage.EVAL)
        ticket.timings["finished_at"] = time.time()
        merged = final_fields(handler, ctx, ticket.outputs, error)
        self.shards.add(build_row(ticket, merged, status, self.worker_id), ticket.name)
        if ticket.state.get("remove_workspaces"):
            self.workspaces_to_remove.add(ticket.name)
        self.counters["finished"] += 1
        if status is not JobStatus.OK:
            self.counters["failed"] += 1
        self.events.emit(ticket.name, "finished", {"status": status.value})

    async def _give_back(self, ticket: Ticket, ctx: JobContext, stage: Stage) -> None:
        """The worker stops while this stage runs: return the job to where it can resume."""
        if stage is not Stage.EVAL:
            await self._close_runtime(ctx)
        if self.lease_lost:
            return  # recovery returned it already; only its sandbox was ours to close
        ticket.history.append({"t": time.time(), "returned": stage.value, "worker": self.worker_id})
        ticket.return_after_loss()
        self._move_out(ticket, self._queue_of(ticket.stage))
        self.events.emit(ticket.name, "returned", {"stage": stage.value, "to": ticket.stage.value})


def _summary_hints_work(summary: Summary, queue: str, node: str) -> bool:
    """The shared queues as the rebuilder found them; a node's run queue, whether a worker there fills it."""
    if queue in summary.queued:
        return summary.queued[queue]
    return node in summary.nodes_filling_run_queues()
