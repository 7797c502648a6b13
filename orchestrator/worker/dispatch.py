"""Dispatch: one loop per stage that starts a job whenever a slot of its pool is free.

A stage's next job comes from the first of its sources that has one:

- INIT: a job of a batch file claimed here (`waiting_init`), else a claim from queue/init;
- RUN: a job INIT prepared here (`prepared`, its sandbox up), else a claim from the node's run queue;
- EVAL: a job whose RUN ended here (`waiting_eval`, its output journaled), else a claim from queue/eval.

With nothing to claim a dispatcher sleeps, backing off, until work of this worker's own wakes it,
its queue directory changes (a stat every QUEUE_WATCH_S, small runs), or (on a large run) the
cluster summary says its queue may hold a ticket. INIT also waits for
room: the node's run queue and the sandbox budget bound how far it prepares ahead. Where run.toml
declares resource classes, INIT's next job is the one the admission rule picks, held here or
queued (worker/class_claims.py, worker/admission.py), and INIT waits while none fits.
"""

from __future__ import annotations

import logging
import time

from orchestrator.spool import fsops
from orchestrator.spool.batches import is_batch
from orchestrator.spool.claims import IDLE_POLL_DUTY
from orchestrator.spool.cluster_summary import Summary
from orchestrator.spool.jobs import Stage
from orchestrator.worker.class_claims import ClassClaims
from orchestrator.worker.job_runner import JobRunner
from orchestrator.worker.moves import TicketMoves
from orchestrator.worker.periodic import wait_or_timeout
from orchestrator.worker.state import Slot, WorkerState

log = logging.getLogger(__name__)

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
RUN_QUEUE_RELIST_S = 0.1   # backpressure lists the node's run queue at most this often
# An idle dispatcher of a small run stats its queue directory this often between listings.
QUEUE_WATCH_S = 0.05
# INIT waiting for room looks again this often, besides being woken when room is made.
ROOM_RECHECK_S = 0.05


class Dispatcher:
    def __init__(self, state: WorkerState, runner: JobRunner, moves: TicketMoves) -> None:
        self.state = state
        self.runner = runner
        self.moves = moves
        self.classes = ClassClaims(state, runner, moves, state.admission) if state.admission is not None else None

    async def dispatch(self, stage: Stage) -> None:
        """Start `stage` of one job per free slot until the worker stops."""
        state = self.state
        backoff = self.idle_backoff_floor()
        polled_at = time.monotonic()   # the last claim that asked the spool
        # Checked, not only cancelled: Python 3.11's wait_for swallows a cancellation that lands
        # as the awaited event is set, and the dispatcher would claim on after a stop.
        while not state.stopping.is_set():
            slot = await state.pools.take(stage)
            if stage is Stage.INIT:
                await self._wait_for_room()
            if state.stopping.is_set():
                slot.give_back()
                return
            if stage is Stage.INIT and self.classes is not None:
                if not self.classes.start_next(slot):
                    slot.give_back()
                    await self._wait_for_admission()
                continue
            if self._start_held(stage, slot):
                continue
            name = None
            if self.may_hold_work(stage, time.monotonic() - polled_at):
                polled_at = time.monotonic()
                name = self._claim(stage)
            if name is None:
                slot.give_back()
                backoff = await self._idle(stage, backoff, polled_at)
                continue
            backoff = self.idle_backoff_floor()
            self._start_claimed(stage, name, slot)

    def _start_held(self, stage: Stage, slot: Slot) -> bool:
        """Start a job this worker holds in memory for `stage` on `slot`; False when none."""
        jobs, runner = self.state.jobs, self.runner
        if stage is Stage.INIT and jobs.waiting_init:   # a job of a batch claimed here
            runner.start_waiting(slot)
            return True
        if stage is Stage.EVAL and jobs.waiting_eval:   # RUN done here: already claimed, output journaled
            ticket = jobs.take_waiting_eval()
            runner.start(stage, ticket.name, slot, ticket=ticket)
            if not jobs.waiting_eval and not self.state.claimers[stage].hinted:
                self.state.pools.wake[stage].clear()   # it was for these jobs: no queue to ask for them
            return True
        if stage is Stage.RUN and jobs.prepared:   # prepared here: already claimed, sandbox up
            admission = self.state.admission
            name = next(iter(jobs.prepared)) if admission is None else admission.next_to_run(
                jobs.prepared, (n for n, (_, s) in jobs.running.items() if s is Stage.RUN))
            ticket = jobs.take_prepared(name)
            self.state.pools.wake[Stage.INIT].set()
            runner.start(stage, name, slot, ticket=ticket)
            return True
        return False

    def _claim(self, stage: Stage) -> str | None:
        claimer = self.state.claimers[stage]
        claimer.watch = self.state.cluster.fresh() is None   # small runs: an idle dispatcher watches its queue
        try:
            return claimer.claim()
        except OSError as exc:  # the spool failing for a moment: try again later, slot freed
            log.warning("claiming from %s failed: %s", claimer.queue, exc)
            return None

    async def _idle(self, stage: Stage, backoff: float, polled_at: float) -> float:
        """Sleep until woken by work of our own or a change of the queue, or until the queue is
        worth asking again; the next backoff."""
        state = self.state
        while True:
            state.pools.wake[stage].clear()
            if await self._sleep(stage, backoff):
                return self.idle_backoff_floor()
            backoff = min(backoff * 2, self.idle_backoff_cap())
            if state.stopping.is_set() or self.may_hold_work(stage, time.monotonic() - polled_at):
                return backoff

    async def _sleep(self, stage: Stage, seconds: float) -> bool:
        """Up to `seconds`; True when woken early: by work of this worker's own, or, on a small run,
        by the queue directory changing since it was found empty (a stat every QUEUE_WATCH_S: a new
        step's first tickets start within that, not after a backoff of up to MAX_IDLE_BACKOFF_S)."""
        state = self.state
        wake, claimer = state.pools.wake[stage], state.claimers[stage]
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            watching = claimer.watch and state.cluster.fresh() is None
            if await wait_or_timeout(wake, min(left, QUEUE_WATCH_S) if watching else left):
                return True
            if watching and not state.stopping.is_set():
                with fsops.duty(IDLE_POLL_DUTY):
                    if claimer.queue_changed():
                        return True
        return False

    def _start_claimed(self, stage: Stage, name: str, slot: Slot) -> None:
        """A ticket or batch file just claimed (`slot` taken for it): start it."""
        state = self.state
        if is_batch(name):
            if stage is Stage.INIT and self.moves.take_batch(name):
                self.runner.start_waiting(slot)
                return
            # corrupt (quarantined), or a batch where only single tickets go (quarantined)
            if stage is not Stage.INIT:
                fsops.quarantine(state.box.dir / name, state.paths.quarantine,
                                 f"a batch file in {state.claimers[stage].queue.name}: batches are queued in queue/init only")
            slot.give_back()
            return
        if stage is Stage.RUN:
            state.run_queue_count.seen = max(0, state.run_queue_count.seen - 1)
            state.pools.wake[Stage.INIT].set()
        self.runner.start(stage, name, slot)

    # -- backpressure -------------------------------------------------------------------------
    async def _wait_for_room(self) -> None:
        """Backpressure: INIT waits while the node's run queue (and the sandbox budget) is full."""
        state = self.state
        options = state.options
        while True:
            prepared = self._prepared_count()
            in_progress = state.pools.busy(Stage.INIT)
            room = prepared + in_progress < int(options.max_prepared or 0) or not options.max_prepared
            if options.max_sandboxes:
                room = room and in_progress + prepared + state.pools.busy(Stage.RUN) < options.max_sandboxes
            if room:
                return
            state.pools.wake[Stage.INIT].clear()
            await wait_or_timeout(state.pools.wake[Stage.INIT], ROOM_RECHECK_S)

    async def _wait_for_admission(self) -> None:
        """No ready class fits: until a job here frees what it held, or new work may have come."""
        state = self.state
        wake = state.pools.wake[Stage.INIT]
        wake.clear()
        await wait_or_timeout(wake, state.poll_period(QUEUE_WATCH_S, MIN_IDLE_BACKOFF_LARGE_S))

    def _prepared_count(self) -> int:
        state = self.state
        if state.keeps_prepared():
            return len(state.jobs.prepared)   # known exactly: nothing to list
        count = state.run_queue_count
        now = time.monotonic()
        if now - count.listed_at > RUN_QUEUE_RELIST_S:
            with fsops.duty("backpressure"):
                count.seen = len(fsops.list_names(state.run_queue))
            count.listed_at = now
        return count.seen

    # -- how often an idle dispatcher asks the spool ------------------------------------------
    def idle_backoff_floor(self) -> float:
        return self.state.poll_period(MIN_IDLE_BACKOFF_S, MIN_IDLE_BACKOFF_LARGE_S)

    def idle_backoff_cap(self) -> float:
        return self.state.poll_period(MAX_IDLE_BACKOFF_S, MAX_IDLE_BACKOFF_LARGE_S)

    def may_hold_work(self, stage: Stage, unpolled_s: float) -> bool:
        """Whether a dispatcher with a free slot should ask the spool for a ticket: always on small
        runs; on a large one after work of this worker's own (its wake-up is set, or it hinted a
        name), when the cluster summary says the queue may hold a ticket, or after a long while."""
        state = self.state
        summary = state.cluster.fresh()
        if summary is None or unpolled_s >= UNHINTED_POLL_LARGE_S:
            return True
        own_work_queued = state.pools.wake[stage].is_set() and not (stage is Stage.RUN and state.keeps_prepared())
        if own_work_queued or state.claimers[stage].hinted:   # (jobs prepared here wait in memory, not in the queue)
            return True
        return _summary_hints_work(summary, state.queue_of(stage).name, state.node)


def _summary_hints_work(summary: Summary, queue: str, node: str) -> bool:
    """The shared queues as the rebuilder found them; a node's run queue, whether a worker there fills it."""
    if queue in summary.queued:
        return summary.queued[queue]
    return node in summary.nodes_filling_run_queues()
