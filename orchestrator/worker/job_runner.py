"""One stage of one job: its asyncio task, the checks before it, the handler call, the routing after.

A stage runs as a task holding a slot of its pool. Before the handler is called the job may
end early (its handler cannot be loaded, or `StageGate` refuses the stage); after, its
outcome sends it on (`TicketMoves`), ends it early, or buffers its row (`finish`). An error of
the engine itself requeues the claim (attempt + 1): a claim must never stay with a task that died;
a full spool gives the job back without charging it an attempt (`FullSpoolReturn`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import AgentHandler, HandlerError, load_handler
from orchestrator.spool import fsops
from orchestrator.spool.jobs import JobStatus, Stage, StageError
from orchestrator.spool.rows import build_row
from orchestrator.spool.token_columns import TOKEN_COLUMNS, TokenColumnsError, token_columns_problem
from orchestrator.spool.tickets import Ticket
from orchestrator.worker.commit import Committer
from orchestrator.worker.full_spool import FullSpoolReturn, disk_full_error
from orchestrator.worker.moves import TicketMoves
from orchestrator.worker.stage_gate import StageGate
from orchestrator.worker.stages import StageOutcome, execute_stage, final_fields
from orchestrator.worker.state import Slot, WorkerState

log = logging.getLogger(__name__)

# The output of the stage before each stage, which it gets as `previous`.
PREVIOUS_STAGE = {Stage.RUN: "init", Stage.EVAL: "run"}


class JobRunner:
    def __init__(self, state: WorkerState, moves: TicketMoves, committer: Committer,
                 lose_lease: Callable[[str], None]) -> None:
        self.state = state
        self.moves = moves
        self.committer = committer
        self.lose_lease = lose_lease
        self.full_spool = FullSpoolReturn(state, moves)
        self.gate = StageGate(state)
        self.handlers: dict[str, AgentHandler] = {}

    # -- the task of a stage ------------------------------------------------------------------
    def start(self, stage: Stage, name: str, slot: Slot | None, ticket: Ticket | None = None) -> None:
        """Run `stage` of job `name` as a task; `slot` (a slot of its pool, or None for a job that
        only ends here) is given back when the task ends."""
        state = self.state
        state.counters["claimed"] += 1
        state.pools.stage_started(stage)
        task = asyncio.create_task(self._process(stage, name, ticket), name=f"{stage.value}:{name}")
        state.jobs.task_started(name, task, stage)
        task.add_done_callback(lambda done: self._slot_done(stage, name, slot, done))

    def start_waiting(self, slot: Slot | None, name: str | None = None) -> None:
        """Start INIT of a job of a held batch (the oldest waiting, or `name`)."""
        ticket = self.state.jobs.take_waiting_init(name)
        self.state.batches.held.mark_started(ticket.name)
        self.start(Stage.INIT, ticket.name, slot, ticket=ticket)

    def _slot_done(self, stage: Stage, name: str, slot: Slot | None, task: asyncio.Task[None]) -> None:
        state = self.state
        state.pools.stage_ended(stage)
        state.jobs.task_ended(name, task)
        if slot is not None:
            slot.give_back()
        admission = state.admission
        if admission is not None and (stage is Stage.RUN or (
                stage is Stage.INIT and name not in state.jobs.running and name not in state.jobs.prepared)):
            if admission.release(name):   # its sandbox is closed (or left with the job): room for INIT
                state.pools.wake[Stage.INIT].set()
        if stage is Stage.INIT or (stage is Stage.RUN and state.options.max_sandboxes):
            state.pools.wake[Stage.INIT].set()   # room for INIT (max_prepared, max_sandboxes): no re-check to wait for
        self.committer.worker_let_go()

    async def _process(self, stage: Stage, name: str, ticket: Ticket | None = None) -> None:
        try:
            await self._run_stage(stage, name, ticket)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or a spool error: the claim must not stay here
            await self._engine_error(stage, name, exc)

    async def _engine_error(self, stage: Stage, name: str, exc: Exception) -> None:
        state = self.state
        if not state.lease_lost and fsops.mtime(state.box.dir) is None:
            self.lose_lease(f"{type(exc).__name__} while carrying job {name}: its claim directory is gone")
        if state.lease_lost:
            log.info("job %s: %s after this worker lost its lease; left to its new owner", name, exc)
            return
        spool_full = disk_full_error(exc)
        if spool_full is None:   # a full spool is no bug: its own warning says what happens (full_spool.py)
            log.error("job %s: worker error in %s: %s: %s", name, stage.value, type(exc).__name__, exc, exc_info=exc)
        ticket = state.jobs.in_flight.get(name)
        if ticket is not None and "sandbox" in ticket.state:
            await self.close_quietly(ticket)
        if self.committer.carries(name):
            return  # its row is on its way: the ticket goes with the shard
        if spool_full is not None:
            await self.full_spool.give_back(name, stage, spool_full)
        else:
            self.moves.requeue_claim(name, f"worker error in {stage.value}: {type(exc).__name__}: {exc}")

    # -- the stage ----------------------------------------------------------------------------
    async def _run_stage(self, stage: Stage, name: str, ticket: Ticket | None = None) -> None:
        state = self.state
        ticket = ticket or self.moves.cached(name, stage) or state.box.load(name)
        if ticket is None:
            return  # corrupt: quarantined by load()
        state.jobs.carrying(name, ticket)
        now = time.time()
        ticket.add_queue_time(now)
        ticket.history.append({"t": now, "stage": stage.value, "worker": state.worker_id, "attempt": ticket.attempt})
        if ticket.status is not None:        # failed or cancelled earlier: only the row is left
            self.finish(ticket, None, None)
            return
        ctx = self.context(ticket, stage)
        handler = await self._handler_if_worth_it(ticket, ctx)
        if handler is None:
            return
        outcome = await self._execute(handler, ticket, ctx)
        await self._route(handler, ticket, ctx, outcome)

    async def _handler_if_worth_it(self, ticket: Ticket, ctx: JobContext) -> AgentHandler | None:
        """The job's handler, or None once the job has ended early: its handler cannot be loaded,
        or the gate refused the stage (worker/stage_gate.py)."""
        try:
            handler = self.handler(ticket.job.handler)
        except HandlerError as exc:
            await self.end_early(ticket, ctx, JobStatus.FAILED, StageError(ctx.stage.value, "HandlerError", str(exc)), {})
            return None
        refused = self.gate.refusal(handler, ticket, ctx.stage, _previous_output(ticket, ctx.stage))
        if refused is not None:
            await self.end_early(ticket, ctx, refused.status, refused.error, {})
            return None
        return handler

    async def _execute(self, handler: AgentHandler, ticket: Ticket, ctx: JobContext) -> StageOutcome:
        """Call the handler within the job's remaining budget; record its output and timings."""
        state, stage, name = self.state, ctx.stage, ticket.name
        budget = state.config.jobs.timeout_s - ticket.counted_s()
        state.events.emit(name, f"{stage.value}_started", {"attempt": ticket.attempt})
        started, started_mono = time.time(), time.monotonic()
        if stage is Stage.RUN:
            ticket.timings["run_started_at"] = started
        try:
            outcome = await execute_stage(handler, ctx, _previous_output(ticket, stage), budget,
                                          lambda: name in state.jobs.user_cancelled)
        except asyncio.CancelledError:
            ticket.timings[f"{stage.value}_s"] = ticket.timings.get(f"{stage.value}_s", 0.0) + time.monotonic() - started_mono
            await self._give_back(ticket, ctx, stage)
            raise
        finally:
            if stage is Stage.RUN:  # the runtime closes right after RUN, before EVAL
                await self.close_runtime(ctx)
        elapsed = time.monotonic() - started_mono
        ticket.timings[f"{stage.value}_s"] = ticket.timings.get(f"{stage.value}_s", 0.0) + elapsed
        if stage is Stage.RUN:
            ticket.timings["run_ended_at"] = time.time()
        ticket.record_output(stage, outcome.output)
        state.events.emit(name, f"{stage.value}_finished", {"s": round(elapsed, 6), **({"status": outcome.status.value} if outcome.status else {})})
        if outcome.error is not None and outcome.error.traceback:
            state.events.emit(name, "stage_failed", {"stage": stage.value, "error": outcome.error.as_text(),
                                                     "traceback": outcome.error.traceback})
        return outcome

    async def _route(self, handler: AgentHandler, ticket: Ticket, ctx: JobContext, outcome: StageOutcome) -> None:
        """Send the job on after its stage: to the next stage (here or queued), early end, or its row."""
        stage, moves = ctx.stage, self.moves
        if stage is Stage.RUN and outcome.error is not None and outcome.error.kind == "SandboxAttachError":
            # The sandbox INIT prepared died with the worker that started it: prepare it again.
            moves.requeue_claim(ticket.name, f"its sandbox is gone: {outcome.error.message}")
        elif outcome.status is not None and stage is not Stage.EVAL:
            await self.end_early(ticket, ctx, outcome.status, outcome.error, outcome.output)
        elif stage is Stage.INIT:
            ticket.node = self.state.node
            if not await self._hand_off(ticket, Stage.RUN):
                if self.state.keeps_prepared():
                    moves.keep_prepared(ticket)
                else:
                    moves.advance(ticket, Stage.RUN)
        elif stage is Stage.RUN:
            if not await self._hand_off(ticket, Stage.EVAL):
                if moves.keeps_for_eval():
                    moves.keep_for_eval(ticket)
                else:
                    moves.advance(ticket, Stage.EVAL)
        else:
            self.finish(ticket, handler, outcome.error, ctx, outcome.status)

    async def _hand_off(self, ticket: Ticket, stage: Stage) -> bool:
        """Go on with `stage` in this process when one of its slots is free (TicketMoves.take_slot)."""
        slot = await self.moves.take_slot(ticket, stage)
        if slot is None:
            return False
        # The claim file still holds the ticket as claimed: the stage gets it from memory.
        self.start(stage, ticket.name, slot, ticket=ticket)
        return True

    # -- ends ---------------------------------------------------------------------------------
    async def end_early(self, ticket: Ticket, ctx: JobContext, status: JobStatus, error: StageError | None,
                        output: dict[str, Any]) -> None:
        """A job that failed, timed out or was cancelled before EVAL: close it, send it to its row."""
        await self.close_runtime(ctx)
        ticket.end_early(status, error.to_record() if error is not None else None, ctx.stage, output)
        if Stage.EVAL in self.state.options.stages:
            self.finish(ticket, self.handlers.get(ticket.job.handler), error, ctx, status)
        else:
            self.moves.advance(ticket, Stage.EVAL)

    def finish(self, ticket: Ticket, handler: AgentHandler | None, error: StageError | None,
               ctx: JobContext | None = None, status: JobStatus | None = None) -> None:
        """Buffer the job's row; its ticket is dropped once the shard holding the row is committed."""
        state = self.state
        if state.lease_lost:
            return  # the claim is another worker's now
        status = ticket.status or status or JobStatus.OK
        if error is None and ticket.error:
            error = StageError.from_record(ticket.error)
        if error is not None:
            ticket.keep_error(error.to_record())
        if handler is None:
            try:
                handler = self.handler(ticket.job.handler)
            except HandlerError:
                handler = None
        ctx = ctx or self.context(ticket, Stage.EVAL)
        ticket.timings["finished_at"] = time.time()
        merged = final_fields(handler, ctx, ticket.outputs, error)
        if status is JobStatus.OK and (problem := token_columns_problem(merged)) is not None:
            # Not trainable as it stands: failed here. The columns go to the row's `result` as given
            # (typed columns could not hold a text log-prob or a list in the mask).
            status, error = JobStatus.FAILED, StageError(Stage.EVAL.value, TokenColumnsError.__name__,
                                                         f"the handler's row ({ticket.job.handler}): {problem}")
            ticket.keep_error(error.to_record())
            refused = {name: merged.pop(name) for name in TOKEN_COLUMNS if name in merged}
            merged = {**merged, "token_columns_refused": refused}
        row = build_row(ticket, merged, status, state.worker_id)
        state.shards.add(row, ticket.name)
        state.recent.add(row)
        if ticket.state.get("remove_workspaces"):
            self.committer.remove_workspace_with_row(ticket.name)
        state.counters["finished"] += 1
        if status is not JobStatus.OK:
            state.counters["failed"] += 1
        state.events.emit(ticket.name, "finished", {"status": status.value})

    async def _give_back(self, ticket: Ticket, ctx: JobContext, stage: Stage) -> None:
        """The worker stops while this stage runs: return the job to where it can resume."""
        if stage is not Stage.EVAL:
            await self.close_runtime(ctx)
        if self.state.lease_lost:
            return  # recovery returned it already; only its sandbox was ours to close
        self.moves.return_to_resume(ticket, stage)

    # -- the job's context and sandbox ---------------------------------------------------------
    def context(self, ticket: Ticket, stage: Stage) -> JobContext:
        return JobContext(job=ticket.job, stage=stage, attempt=ticket.attempt, services=self.state.services,
                          state=ticket.state)

    def handler(self, name: str) -> AgentHandler:
        handler = self.handlers.get(name)
        if handler is None:
            handler = self.handlers[name] = load_handler(name)
        return handler

    async def close_runtime(self, ctx: JobContext) -> None:
        try:
            await asyncio.shield(ctx.close_runtime())
        except Exception as exc:
            log.warning("closing the runtime of %s failed: %s", ctx.job.job_id, exc)

    async def close_quietly(self, ticket: Ticket) -> None:
        ctx = self.context(ticket, Stage.RUN)
        try:
            await ctx.close_runtime()
        except Exception as exc:
            log.warning("closing the sandbox of %s: %s", ticket.name, exc)


def _previous_output(ticket: Ticket, stage: Stage) -> dict[str, Any]:
    return ticket.outputs.get(PREVIOUS_STAGE.get(stage, ""), {}) or {}
