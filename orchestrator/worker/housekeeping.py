"""The worker's periodic duties, each its own task (worker/periodic.py), each charged to its own
fsops duty: the heartbeat, recovery of dead workers' claims, the cluster view, the cancel and
stop polls, the sandbox sweep, the claim audit, the access check and the idle exit.
"""

from __future__ import annotations

import asyncio
import logging
import time

from orchestrator.spool import fsops
from orchestrator.spool.batches import is_batch
from orchestrator.spool.cluster_summary import LARGE_RUN_WORKERS
from orchestrator.spool.jobs import Stage
from orchestrator.spool.recovery import reap_expired, reap_found
from orchestrator.worker.commit import Committer
from orchestrator.worker.heartbeat import Heartbeat
from orchestrator.worker.idle import IdleClock, launcher_gone, poll_period
from orchestrator.worker.job_runner import JobRunner
from orchestrator.worker.moves import TicketMoves
from orchestrator.worker.periodic import PeriodicDuty
from orchestrator.worker.state import WorkerState

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
# Directories opened to others mid-run are closed again within this (7 stats per worker).
ACCESS_CHECK_S = 300.0
COMMIT_EVERY_S = 0.05


class Housekeeping:
    def __init__(self, state: WorkerState, runner: JobRunner, moves: TicketMoves, committer: Committer,
                 heartbeat: Heartbeat) -> None:
        self.state = state
        self.runner = runner
        self.moves = moves
        self.committer = committer
        self.heartbeat = heartbeat
        self.idle = IdleClock(float(state.options.idle_exit_s or 0),
                              orphaned=launcher_gone(state.options.launcher_pid) if state.options.launcher_pid else None)
        self.cancel_swept_at = 0.0
        self.stray_claims: set[str] = set()

    def duties(self) -> list[PeriodicDuty]:
        leases = self.state.config.leases
        duties = [
            PeriodicDuty("heartbeat", leases.heartbeat_s, self.beat),
            PeriodicDuty("recovery", max(leases.lease_s / 3, 0.1), self.recover),
            PeriodicDuty("cluster_view", max(self.state.config.llm.view_s, 0.5), self.refresh_cluster_view),
            PeriodicDuty("cancel_poll", lambda: self.request_poll_period(CANCEL_POLL_S, CANCEL_POLL_LARGE_S),
                         self.poll_cancels),
            PeriodicDuty("stop_poll", lambda: self.request_poll_period(STOP_POLL_S, STOP_POLL_LARGE_S),
                         self.poll_stop_request),
            PeriodicDuty("commit", COMMIT_EVERY_S, self.committer.commit_if_due, self.committer.wake),
            PeriodicDuty("sandbox_sweep", SWEEP_EVERY_S, self.sweep_in_background),
            PeriodicDuty("claim_audit", leases.lease_s, self.audit_claims),
            PeriodicDuty("access_check", ACCESS_CHECK_S, self.state.check_directories),
        ]
        if self.idle.enabled:
            period = poll_period(self.idle.shortest_window_s, leases.heartbeat_s)
            duties.append(PeriodicDuty("idle_exit", period, self.exit_if_idle))
        return duties

    def request_poll_period(self, small_run_s: float, large_run_s: float) -> float:
        """cancel/ and control/stop: a large run with a fresh cluster summary finds them there, in
        memory, so it looks as often as a small run polls; without one, every large_run_s."""
        if self.state.cluster.fresh() is not None:
            return small_run_s
        return self.state.poll_period(small_run_s, large_run_s)

    # -- liveness: ours and the others' ---------------------------------------------------------
    async def beat(self) -> None:
        state = self.state
        if state.lease_lost:
            return
        if state.services.llm_router is not None:   # in-flight counts held back on a large run (its
            state.services.llm_router.board.publish_if_due()   # tasks run long: no new pick publishes)
        self.moves.expire_cache()
        await self.heartbeat.beat_checked()

    async def recover(self) -> None:
        state = self.state
        if state.lease_lost or state.cluster.fresh() is not None:
            return   # a large run: the summary's rebuilder finds the dead workers (refresh_cluster_view)
        config = state.config
        moved = await state.in_spool_io(reap_expired, state.paths, state.worker_id, config.leases.lease_s,
                                        config.jobs.max_attempts, state.events.emit, None, state.count_workers)
        state.requeued(moved)

    async def refresh_cluster_view(self) -> None:
        """Large runs: re-read the cluster summary when a newer one may exist (rebuild it when due,
        and then return the dead workers' claims it found); small runs: nothing."""
        state = self.state
        if state.lease_lost or state.cluster_workers <= LARGE_RUN_WORKERS:
            return
        moved = await state.in_spool_io(self._read_cluster_view)
        summary = state.cluster.fresh()
        if summary is not None:
            state.count_workers(summary.alive)
        state.requeued(moved)

    def _read_cluster_view(self) -> int:
        state = self.state
        config = state.config
        rebuilt = state.cluster.refresh(recover=lambda found: reap_found(
            state.paths, state.worker_id, config.leases.lease_s, config.jobs.max_attempts, state.events.emit, found))
        return rebuilt.moved if rebuilt is not None else 0

    # -- requests: cancel and stop --------------------------------------------------------------
    def poll_cancels(self) -> None:
        state = self.state
        cancels, jobs = state.cancels, state.jobs
        before = cancels.signature()
        summary = state.cluster.fresh()
        if summary is not None:   # a large run: cancel/ as the summary's rebuilder listed it
            cancels.apply(summary.cancel_names, summary.cancel_all)
        else:
            cancels.refresh()
        now = time.monotonic()
        if cancels.signature() != before or now - self.cancel_swept_at > CANCEL_SWEEP_S:
            self.cancel_swept_at = now
            self._sweep_cancelled_queued()
        for name, ticket in list(jobs.waiting_init.items()):
            if cancels.is_cancelled(ticket.job):   # a job of a held batch: it ends now
                self.runner.start_waiting(None, name=name)
        for name, ticket in list(jobs.prepared.items()):
            if cancels.is_cancelled(ticket.job):   # it ends now, its sandbox closed
                jobs.take_prepared(name)
                state.pools.wake[Stage.INIT].set()
                self.runner.start(Stage.RUN, name, None, ticket=ticket)
        for name, ticket in list(jobs.waiting_eval.items()):
            if cancels.is_cancelled(ticket.job):   # it ends now, without its EVAL
                jobs.take_waiting_eval(name)
                self.runner.start(Stage.EVAL, name, None, ticket=ticket)
        for job_id in list(jobs.running):
            in_flight = jobs.in_flight.get(job_id)
            if job_id not in jobs.user_cancelled and in_flight is not None and cancels.is_cancelled(in_flight.job):
                jobs.cancel_running(job_id)

    def _sweep_cancelled_queued(self) -> None:
        """Cancelled jobs still waiting in a queue end now, not when a slot would free up."""
        state = self.state
        cancels = state.cancels
        if not cancels.any:
            return
        for stage in Stage:
            if stage not in state.options.stages:
                continue
            queue = state.queue_of(stage)
            for name in fsops.list_names(queue):
                if is_batch(name) and state.stopping.is_set():
                    continue   # its other jobs would only go back: leave it to a worker that stays
                if cancels.matches_name(name) and fsops.rename(queue / name, state.box.dir / name):
                    if is_batch(name):   # its jobs wait here; the cancelled ones end at once (poll_cancels)
                        self.moves.take_batch(name)
                    else:
                        self.runner.start(stage, name, None)

    def poll_stop_request(self) -> None:
        state = self.state
        summary = state.cluster.fresh()
        if summary is None:
            fsops.refresh_dir(state.paths.control)   # a stop written on another node: seen now, not after acdirmin
        requested = summary.stop_key if summary is not None else fsops.identity(state.paths.stop_request)
        if requested is not None and requested != state.stop_seen:
            log.info("stop requested through %s", state.paths.stop_request)
            state.request_stop()

    def exit_if_idle(self) -> None:
        state = self.state
        # Jobs prepared on this node wait in its run queue, which the idle clock lists at the deadline.
        # Rows count until their shard is renamed in: a slow write has taken them out of the buffer already.
        holding = state.jobs.holding() or self.committer.rows_buffered() > 0
        if self.idle.expired(holding, [state.queue_of(s) for s in state.options.stages], state.counters["claimed"]):
            log.info("worker %s: idle for %.1fs, giving its node back", state.worker_id, self.idle.idle_for())
            state.events.emit("-", "idle_exit", {"idle_s": round(self.idle.idle_for(), 3)})
            state.request_stop()

    # -- hygiene: orphaned sandboxes, stray claims ----------------------------------------------
    def sweep_in_background(self) -> None:
        # Killing a stubborn sandbox may take seconds: keep the event loop (and heartbeats) going.
        asyncio.get_running_loop().run_in_executor(None, self.sweep_sandboxes)

    def sweep_sandboxes(self) -> None:
        from orchestrator.sandbox.start import sweep_orphaned_sandboxes

        try:
            reaped = sweep_orphaned_sandboxes()
            if reaped:
                self.state.events.emit("-", "sandboxes_reaped", {"count": reaped})
        except Exception as exc:  # the sweep is hygiene: never let it stop the worker
            log.warning("sandbox sweep failed: %s", exc)

    async def audit_claims(self) -> None:
        """Claims no part of this worker is carrying (a bug, an error while giving one back) are
        requeued once seen twice in a row: a claim must never sit here forever."""
        state = self.state
        if state.lease_lost or state.stopping.is_set():
            return
        held = set(await state.in_spool_io(state.box.names))
        carried = state.jobs.names() | self.committer.carried()
        batches = state.batches
        in_batches = batches.held.unresolved_jobs()   # their own files too: they leave the batch's way
        strays = (held - carried - batches.held.names() - batches.emptied - in_batches) | (in_batches - carried)
        for name in strays & self.stray_claims:
            self.moves.requeue_claim(name, "claim held by no task of its worker")
        self.stray_claims = strays - self.stray_claims
