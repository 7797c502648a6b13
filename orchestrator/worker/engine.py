"""The worker: INIT, RUN and EVAL pools of one process, fed by claims from the spool.

Each pool has a dispatcher that claims a ticket whenever a slot is free and starts the stage
as an asyncio task. Between stages a ticket goes back through the spool (node-local run
queue, shared eval queue), so another process can pick it up and a crash loses nothing; the
worker only keeps a cache of tickets it wrote itself, to skip re-reading them.

`Worker` wires the collaborators over one shared `WorkerState` (worker/state.py) and runs its
life: start, serve until asked to stop, drain, give back, retire. The collaborators:

    Dispatcher    (dispatch.py)     per stage, where the next job comes from; backpressure
    JobRunner     (job_runner.py)   one stage of one job: checks, the handler call, routing, the row
    TicketMoves   (moves.py)        where a ticket goes next: queues, waits here, back, requeue
    Committer     (commit.py)       buffered rows -> shard -> claims dropped (settle)
    Housekeeping  (housekeeping.py) heartbeat, recovery, cluster view, cancel/stop polls, sweep,
                                    claim audit, idle exit (Heartbeat in heartbeat.py)
    Drain         (drain.py)        what a stopping worker gives back
    QueueWatch    (queue_watch.py)  wakes an idle dispatcher when a ticket lands in its queue here
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from orchestrator.config import RunConfig
from orchestrator.spool import fsops
from orchestrator.spool.jobs import Stage
from orchestrator.spool.liveness import mark_fenced, retire
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.recovery import release_own_claims
from orchestrator.worker import periodic
from orchestrator.worker.commit import Committer
from orchestrator.worker.dispatch import Dispatcher
from orchestrator.worker.drain import Drain
from orchestrator.worker.heartbeat import Heartbeat
from orchestrator.worker.housekeeping import Housekeeping
from orchestrator.worker.job_runner import JobRunner
from orchestrator.worker.moves import TicketMoves
from orchestrator.worker.options import WorkerOptions
from orchestrator.worker.queue_watch import QueueWatch
from orchestrator.worker.state import WorkerState
from orchestrator.worker.warm_up import warm_up

log = logging.getLogger(__name__)

EXIT_LEASE_LOST = 3    # serve() result when the worker's claims were taken over (see main.py)


class Worker:
    def __init__(self, paths: SpoolPaths, config: RunConfig, options: WorkerOptions) -> None:
        self.state = state = WorkerState(paths, config, options)
        self.committer = Committer(state, self.lose_lease)
        self.moves = TicketMoves(state)
        self.runner = JobRunner(state, self.moves, self.committer, self.lose_lease)
        self.dispatcher = Dispatcher(state, self.runner, self.moves)
        self.heartbeat = Heartbeat(state, self.committer.rows_buffered, self.lose_lease)
        self.housekeeping = Housekeeping(state, self.runner, self.moves, self.committer, self.heartbeat)
        self.drain = Drain(state, self.runner, self.moves)
        self.queue_watch = QueueWatch(state)
        self.fatal: BaseException | None = None

    # What main.py and the tests see of a worker.
    @property
    def worker_id(self) -> str:
        return self.state.worker_id

    @property
    def events(self) -> Any:
        return self.state.events

    @property
    def stopping(self) -> asyncio.Event:
        return self.state.stopping

    @property
    def grace_s(self) -> float:
        return self.state.grace_s

    def request_stop(self, grace_s: float | None = None) -> None:
        """Stop claiming; finish running stages within `grace_s`, then return what is left."""
        self.state.request_stop(grace_s)

    # -- life cycle ---------------------------------------------------------------------------
    async def serve(self) -> int:
        """Run until asked to stop; the exit code (EXIT_LEASE_LOST when fenced out)."""
        state = self.state
        self._announce()
        background = [periodic.start(duty) for duty in self.housekeeping.duties()]
        warming = await self._start_warm_up()
        dispatchers = [
            asyncio.create_task(self.dispatcher.dispatch(stage), name=f"dispatch-{stage.value}")
            for stage in Stage if state.options.pool_size(stage) > 0
        ]
        for task in background + dispatchers:
            task.add_done_callback(self._essential_done)
        self.queue_watch.start()
        try:
            await state.stopping.wait()
        finally:
            self.queue_watch.stop()
        state.state = "draining"
        if not state.lease_lost:
            self.heartbeat.beat()
        for task in [*dispatchers, *([warming] if warming else [])]:
            task.cancel()
        await asyncio.gather(*dispatchers, *([warming] if warming else []), return_exceptions=True)
        await self.drain.drain()
        if state.services.llm_router is not None:
            await state.services.llm_router.close()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        state.journal.close()   # what it holds goes with the claims left (recovery reads it)
        if not state.lease_lost:
            await self._give_back_the_rest()
        else:
            state.shards.take()  # rows of claims other workers now hold: never committed
            try:   # it commits nothing more: readers stop probing its writer (the reaper may have
                state.shards.close()   # closed the worker's writers before this one was registered)
            except OSError as exc:
                log.warning("could not close the shard writer of fenced worker %s: %s", state.worker_id, exc)
            state.state = "fenced"
        return self._retire()

    async def _start_warm_up(self) -> asyncio.Task[None] | None:
        """Hold every RUN slot until the warm-up is over (worker/warm_up.py): the RUN dispatcher and
        INIT's hand-off find none free, so no RUN starts (and no job's RUN time runs) before the
        tokenizers are loaded, while INIT and EVAL claim at once: every worker takes its share of
        the queue from the start, whoever warms up first."""
        state = self.state
        size = state.options.pool_size(Stage.RUN)
        if size == 0:
            return None   # an INIT/EVAL-only worker loads no tokenizer
        held = [await state.pools.take(Stage.RUN) for _ in range(size)]   # free at start: at once

        async def warm_then_free() -> None:
            try:
                await self._warm_up()
            except Exception as exc:   # a failed warm-up leaves the loading to the first job, as before
                log.warning("worker %s: warm-up failed: %s", self.state.worker_id, exc)
            finally:
                for slot in held:
                    slot.give_back()

        return asyncio.create_task(warm_then_free(), name="warm-up")

    async def _warm_up(self) -> None:
        state = self.state
        warmed = await warm_up(state.paths, state.stopping)
        state.info["warm_up_s"] = warmed["seconds"]
        state.events.emit("-", "worker_warmed", warmed)
        log.info("worker %s warmed up in %.1fs (%d tokenizer(s))", state.worker_id, warmed["seconds"],
                 warmed["tokenizers"])

    def _announce(self) -> None:
        state = self.state
        self.heartbeat.beat()
        state.events.emit("-", "worker_started", {"node": state.node, "pid": os.getpid(),
                                                  "stages": sorted(s.value for s in state.options.stages)})
        log.info("worker %s on %s: pools %s", state.worker_id, state.node,
                 {s.value: state.options.pool_size(s) for s in Stage})
        self.housekeeping.sweep_sandboxes()
        with fsops.duty("cancel_poll"):   # requests made before this worker started hold from its first claim
            state.cancels.refresh()

    async def _give_back_the_rest(self) -> None:
        """A clean stop: commit the rows, give back the claims left, say so in the heartbeat."""
        state = self.state
        await self.committer.commit()
        if not state.shards.pending:
            state.shards.close()   # readers stop probing this writer
        state.batches.close(stopped_cleanly=True)
        leftovers = await state.in_spool_io(
            release_own_claims, state.paths, state.worker_id, state.config.jobs.max_attempts, state.events.emit)
        state.counters["requeued"] += leftovers
        state.state = "stopped" if self.fatal is None else "failed"
        self.heartbeat.beat()

    def _retire(self) -> int:
        state = self.state
        state.batches.close(stopped_cleanly=False)
        retire(state.paths, state.worker_id)
        self.heartbeat.close()
        state.events.emit("-", "worker_stopped", {"state": state.state, **state.counters})
        state.events.close()
        state.spool_io.shutdown(wait=True)
        state.heartbeat_io.shutdown(wait=True)
        if state.lease_lost:
            return EXIT_LEASE_LOST
        if self.fatal is not None:
            log.error("worker %s exits: %s", state.worker_id, self.fatal)
            return 1
        return 0

    def lose_lease(self, how: str) -> None:
        """Our claims were taken over (we were paused, partitioned or suspended past the lease).

        Everything this worker holds is somebody else's now: say so, write nothing for those
        jobs, close their sandboxes, and stop; main.py starts a fresh worker in this process.
        """
        state = self.state
        if state.lease_lost:
            return
        state.lease_lost = how
        dropped = self.committer.rows_buffered()
        running = len(state.jobs.running)
        log.error("worker %s lost its lease (%s): its claims were returned to the queues by another worker; "
                  "dropping %d buffered row(s) and %d running stage(s), then re-registering",
                  state.worker_id, how, dropped, running)
        state.events.emit("-", "lease_lost", {"how": how, "dropped_rows": dropped, "running": running})
        try:   # the attempts lost with our claims are not the jobs' fault (spool/recovery.py _count_loss)
            mark_fenced(state.paths, state.worker_id)
        except OSError as exc:
            log.warning("could not mark %s as fenced: %s", state.worker_id, exc)
        state.request_stop(0.0)

    def _essential_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or self.state.stopping.is_set():
            return
        exc = task.exception()
        self.fatal = exc or RuntimeError(f"{task.get_name()} ended unexpectedly")
        log.error("essential part %s of worker %s failed: %r", task.get_name(), self.state.worker_id, self.fatal)
        self.state.request_stop(0.0)
