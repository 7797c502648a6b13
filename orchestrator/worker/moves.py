"""Where a ticket goes after a stage: to a queue, to a wait in this worker's memory, back.

Every change of a ticket's stage, status or attempt is a `Ticket` method (spool/tickets.py);
this module only decides which one applies and where the ticket goes next, and moves it:
queued tickets through the claim box (or, for a job of a held batch, as a ticket of its own,
spool/handoffs.py), jobs that wait here into the worker's held lists.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from orchestrator.spool.jobs import Stage
from orchestrator.spool.journal import JournalEntry, RecordKind
from orchestrator.spool.recovery import requeue_claim
from orchestrator.spool.tickets import Ticket
from orchestrator.worker.state import Slot, WorkerState

log = logging.getLogger(__name__)

CACHE_TRUST_S = 10.0   # below any sensible lease: a ticket we wrote this recently was not recovered


class TicketMoves:
    def __init__(self, state: WorkerState) -> None:
        self.state = state

    # -- tickets this worker queued itself ---------------------------------------------------
    def cached(self, name: str, stage: Stage) -> Ticket | None:
        """The ticket as this worker last wrote it, if that is still what the claim holds.

        A ticket that went to another worker and came back (returned to INIT, say) has another
        stage than the one we wrote, and is read from disk again.
        """
        ticket = self.state.jobs.take_written(name)
        if ticket is None or ticket.stage is not stage or time.time() - ticket.enqueued_at > CACHE_TRUST_S:
            return None
        return ticket

    def expire_cache(self) -> None:
        self.state.jobs.forget_written_before(time.time() - CACHE_TRUST_S)

    # -- on to the next stage ----------------------------------------------------------------
    def advance(self, ticket: Ticket, stage: Stage) -> None:
        """Queue the ticket for `stage` (the next dispatcher here is told its name)."""
        state = self.state
        ticket.mark_enqueued(stage)
        self.move_out(ticket, state.queue_of(stage))
        if stage is Stage.RUN:
            state.run_queue_count.seen += 1  # counted now; the periodic listing corrects it
        state.jobs.remember_written(ticket)
        state.claimers[stage].hint(ticket.name)
        state.pools.wake[stage].set()
        state.pools.wake[Stage.INIT].set()

    def move_out(self, ticket: Ticket, queue: Path) -> None:
        """Save the ticket and hand it to `queue` (ClaimBox.advance). A job of a held batch leaves
        as its own ticket: written here first, recorded in the hand-off log, then renamed, so
        that recovery finds it exactly once whatever moment a crash comes (spool/handoffs.py)."""
        batches = self.state.batches
        if batches.holds(ticket.name):
            batches.leave(ticket, queue)
        else:
            self.state.box.advance(ticket, queue)

    async def take_slot(self, ticket: Ticket, stage: Stage) -> Slot | None:
        """Take a free slot of `stage` here for the ticket (None when none is free).

        Skips a queue round trip (a rename out, a rename back in, a race with other workers).
        INIT -> RUN needs no write at all: should this worker die, recovery sends the job back
        to INIT either way. RUN -> EVAL journals the RUN output first (a data append, not a
        ticket rewrite): a crash during EVAL then resumes at EVAL elsewhere.
        """
        state = self.state
        if stage not in state.options.stages or state.stopping.is_set():
            return None
        slot = await state.pools.take_if_free(stage)
        if slot is None:
            return None
        ticket.mark_enqueued(stage)
        if stage is Stage.EVAL:
            try:
                self.journal_run_output(ticket)
            except BaseException:  # a full spool, say: the slot must not leak with the error
                slot.give_back()
                raise
        return slot

    def journal_run_output(self, ticket: Ticket) -> None:
        """Append what a ticket save would have written; rotate once the journal is large
        (its obsolete entries are those of jobs no longer claimed: committed, handed on; a job
        of a held batch has no claim file of its own, its batch file stands for it)."""
        state = self.state
        journal = state.journal
        journal.append(JournalEntry(RecordKind.RUN_OUTPUT, ticket.name, ticket.attempt, ticket.progress()))
        if journal.due():
            claimed = set(state.box.names())
            live = {job for job in journal.entries() if job in claimed or state.batches.held.batch_of(job) is not None}
            try:
                journal.rotate(live)
            except OSError as exc:   # the record is safe; the journal only grows until the next try
                log.warning("rotating the journal %s failed: %s", journal.path, exc)

    # -- waiting here for a slot --------------------------------------------------------------
    def keeps_for_eval(self) -> bool:
        """Room for one more job to wait here for an EVAL slot (see HeldJobs.waiting_eval)."""
        state = self.state
        return (Stage.EVAL in state.options.stages and not state.stopping.is_set()
                and len(state.jobs.waiting_eval) < state.options.pool_size(Stage.EVAL))

    def keep_for_eval(self, ticket: Ticket) -> None:
        """Every EVAL slot is busy: the job waits here for one. Its RUN output is journaled first,
        so a crash meanwhile resumes it at EVAL elsewhere, as the eval queue would. The wake-up
        matters when the EVAL dispatcher sleeps after an empty claim (in-place hand-offs filled
        its slots meanwhile): on a large run nothing else would wake it for up to 30 s."""
        state = self.state
        ticket.mark_enqueued(Stage.EVAL)
        self.journal_run_output(ticket)
        state.jobs.wait_for_eval(ticket)
        state.pools.wake[Stage.EVAL].set()
        state.events.emit(ticket.name, "eval_waiting", {"waiting": len(state.jobs.waiting_eval)})

    def keep_prepared(self, ticket: Ticket) -> None:
        """Every RUN slot is busy: the job waits here for one. Nothing is written: a crash sends
        its claim (still saying INIT) back to INIT, exactly as the node's run queue would."""
        state = self.state
        if state.stopping.is_set():
            self.advance(ticket, Stage.RUN)   # the drain returns it from the run queue
            return
        ticket.mark_enqueued(Stage.RUN)
        state.jobs.keep_prepared(ticket)
        state.pools.wake[Stage.RUN].set()

    def take_batch(self, name: str) -> bool:
        """A batch file just claimed here: its jobs wait in memory for INIT slots. False when corrupt
        (quarantined, never deleted)."""
        state = self.state
        tickets = state.batches.take(name)
        if tickets is None:
            state.events.emit("-", "batch_quarantined", {"batch": name})
            return False
        for ticket in tickets:
            state.jobs.wait_for_init(ticket)
        state.pools.wake[Stage.INIT].set()
        return True

    # -- back to a queue -----------------------------------------------------------------------
    def return_to_resume(self, ticket: Ticket, stage: Stage) -> None:
        """The worker stops while `stage` runs: back to where the job can resume (Ticket.return_after_loss)."""
        state = self.state
        ticket.history.append({"t": time.time(), "returned": stage.value, "worker": state.worker_id})
        ticket.return_after_loss()
        self.move_out(ticket, state.queue_of(ticket.stage))
        state.events.emit(ticket.name, "returned", {"stage": stage.value, "to": ticket.stage.value})

    def requeue_claim(self, name: str, reason: str) -> None:
        """A claim this worker cannot carry on (an engine error): back to its queue, attempt + 1."""
        state = self.state
        if state.batches.holds(name) and not self._out_of_its_batch(name):
            return
        try:
            moved = requeue_claim(state.paths, state.box.dir / name, f"{reason} (worker {state.worker_id})",
                                  state.config.jobs.max_attempts, state.events.emit, state.journal.entries())
        except FileNotFoundError:
            return  # moved on meanwhile
        except OSError as exc:
            log.error("job %s: could not requeue its claim (%s); the claim audit will try again", name, exc)
            return
        state.counters["requeued"] += moved
        state.claimers[Stage.INIT].forget()

    def _out_of_its_batch(self, name: str) -> bool:
        """A job of a held batch leaves as its own ticket first; False when that failed (retried)."""
        state = self.state
        ticket = state.jobs.in_flight.get(name) or state.jobs.forget_waiting_init(name) \
            or state.batches.held.ticket(name)
        try:
            if ticket is None:
                raise FileNotFoundError(f"no ticket of job {name} in memory")
            state.batches.leave_by_requeue(ticket)
        except OSError as exc:   # a full spool, say: the batch still holds it, the audit retries
            log.error("job %s: could not requeue it out of its batch (%s); the claim audit will try again", name, exc)
            return False
        return True
