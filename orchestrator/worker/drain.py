"""What a stopping worker gives back, and how long it lets running stages finish.

At a stop the dispatchers are gone; jobs waiting here in memory go back to the queues (jobs
prepared here to INIT, their sandboxes dying with us; jobs waiting for EVAL to queue/eval with
their RUN output; unstarted jobs of held batches unchanged), running stages get the grace
period, and whatever still runs after it is cancelled and returned by its own task.
"""

from __future__ import annotations

import asyncio
import logging
import time

from orchestrator.spool import fsops
from orchestrator.spool.jobs import Stage
from orchestrator.spool.tickets import Ticket
from orchestrator.worker.job_runner import JobRunner
from orchestrator.worker.moves import TicketMoves
from orchestrator.worker.state import WorkerState

log = logging.getLogger(__name__)


class Drain:
    def __init__(self, state: WorkerState, runner: JobRunner, moves: TicketMoves) -> None:
        self.state = state
        self.runner = runner
        self.moves = moves

    async def drain(self) -> None:
        """Give back what waits here, let running stages finish within the grace period."""
        state = self.state
        self._return_prepared()
        self._evaluate_waiting()
        deadline = time.monotonic() + state.grace_s
        while time.monotonic() < deadline and state.grace_s > 0:
            self._evaluate_own_runs()
            if not state.jobs.running:
                break
            await asyncio.sleep(0.05)
        for task, _ in list(state.jobs.running.values()):
            task.cancel()
        pending = [task for task, _ in state.jobs.running.values()]
        await asyncio.gather(*pending, return_exceptions=True)

    def _evaluate_own_runs(self) -> None:
        """While draining, jobs whose RUN just finished here are evaluated here too, not left queued."""
        state = self.state
        if Stage.EVAL not in state.options.stages or state.lease_lost:
            return
        for name, ticket in list(state.jobs.written.items()):
            if ticket.stage is Stage.EVAL and fsops.rename(state.paths.eval_queue / name, state.box.dir / name):
                self.runner.start(Stage.EVAL, name, None)

    def _evaluate_waiting(self) -> None:
        """Jobs waiting here for an EVAL slot go to queue/eval with their RUN output, attempt
        unchanged (their RUN went well): evaluated here within the grace period as this worker's
        own runs are, else by whoever claims them. Started here instead, a stop without grace
        would cancel them before their first step and charge them an attempt."""
        state = self.state
        waiting = state.jobs.take_all_waiting_eval()
        if state.lease_lost:
            return   # their claims are another worker's now
        for ticket in waiting.values():
            self.moves.advance(ticket, Stage.EVAL)

    def _return_prepared(self) -> None:
        """Jobs this worker prepared but nobody started: their sandboxes die with us, so back to INIT."""
        state = self.state
        self._return_waiting()
        jobs = state.jobs
        for name in list(jobs.prepared):
            ticket = jobs.take_prepared(name)
            self._close_in_background(ticket)
            if state.lease_lost:
                continue  # its claim is another worker's now
            ticket.back_to_init()
            self.moves.move_out(ticket, state.paths.init_queue)
            state.events.emit(name, "returned", {"stage": "run", "to": "init"})
        for name in list(jobs.written):
            written = jobs.take_written(name)
            if written is not None and written.stage is Stage.RUN and written.status is None:
                self._return_from_run_queue(written)

    def _return_from_run_queue(self, ticket: Ticket) -> None:
        """A job this worker prepared and queued in the node's run queue, unless claimed meanwhile:
        not claimed by us, so fenced or not, it may go back."""
        state, name = self.state, ticket.name
        holding = state.paths.tmp / f".return-{name}"
        if not fsops.rename(state.run_queue / name, holding):
            return  # already claimed by someone
        self._close_in_background(ticket)
        ticket.back_to_init()
        fsops.write_atomic(state.paths.init_queue / name, ticket.encode(), state.paths.tmp)
        fsops.unlink(holding)
        state.events.emit(name, "returned", {"stage": "run", "to": "init"})

    def _return_waiting(self) -> None:
        """Jobs of held batches that never started go back unchanged: a batch none of whose jobs
        started goes back whole (one rename), the others one ticket each."""
        state = self.state
        waiting = state.jobs.take_all_waiting_init()
        if state.lease_lost:
            return
        by_batch: dict[str, list[Ticket]] = {}
        for ticket in waiting.values():
            by_batch.setdefault(state.batches.held.batch_of(ticket.name) or "", []).append(ticket)
        for name, tickets in by_batch.items():
            if name and state.batches.give_back_whole(name, state.paths.init_queue):
                continue
            for ticket in tickets:
                try:
                    self.moves.move_out(ticket, state.paths.init_queue)
                except OSError as exc:   # a full spool: the batch file still holds it, returned at the end
                    log.warning("job %s: could not give it back (%s); its batch goes back with the claims", ticket.name, exc)

    def _close_in_background(self, ticket: Ticket) -> None:
        asyncio.get_running_loop().create_task(self.runner.close_quietly(ticket))
