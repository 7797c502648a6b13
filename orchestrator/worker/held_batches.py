"""The batch files a worker holds in its claim directory, and which of their jobs are unresolved.

A batch file stays claimed until each of its jobs has its row committed in one of the worker's
shards, or has left as a ticket of its own (orchestrator/spool/handoffs.py); then it is unlinked, one
unlink for the batch. Used from the event loop and the commit thread: one lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.spool import fsops
from orchestrator.spool.claims import ClaimBox
from orchestrator.spool.handoffs import HandoffLog
from orchestrator.spool.shards import ShardWriter
from orchestrator.spool.tickets import Ticket


@dataclass
class OpenBatch:
    name: str
    unresolved: set[str]
    started: bool = False                 # a job of it went into a stage (else it may go back whole)
    first_shard: int | None = None        # the first of the worker's shards with a row of it


@dataclass
class HeldBatches:
    _open: dict[str, OpenBatch] = field(default_factory=dict)
    _batch_of: dict[str, str] = field(default_factory=dict)
    _tickets: dict[str, Ticket] = field(default_factory=dict)   # of the unresolved jobs, as last carried
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, name: str, tickets: list[Ticket]) -> None:
        with self._lock:
            self._open[name] = OpenBatch(name, {ticket.name for ticket in tickets})
            for ticket in tickets:
                self._batch_of[ticket.name] = name
                self._tickets[ticket.name] = ticket

    def ticket(self, job_id: str) -> Ticket | None:
        return self._tickets.get(job_id)

    def unresolved_jobs(self) -> set[str]:
        with self._lock:
            return set(self._tickets)

    def batch_of(self, job_id: str) -> str | None:
        return self._batch_of.get(job_id)

    def names(self) -> set[str]:
        with self._lock:
            return set(self._open)

    def mark_started(self, job_id: str) -> None:
        with self._lock:
            name = self._batch_of.get(job_id)
            if name in self._open:
                self._open[name].started = True

    def started(self, name: str) -> bool:
        batch = self._open.get(name)
        return batch is not None and batch.started

    def resolve(self, job_id: str, shard_seq: int | None = None) -> str | None:
        """`job_id` is resolved (its row in shard `shard_seq`, or handed off when None); the
        name of its batch when that was its last unresolved job (the caller unlinks the file)."""
        with self._lock:
            name = self._batch_of.pop(job_id, None)
            self._tickets.pop(job_id, None)
            batch = self._open.get(name) if name is not None else None
            if batch is None:
                return None
            batch.unresolved.discard(job_id)
            if shard_seq is not None and batch.first_shard is None:
                batch.first_shard = shard_seq
            if batch.unresolved:
                return None
            del self._open[batch.name]
            return batch.name

    def forget(self, name: str) -> None:
        """The batch file left whole (given back unstarted): nothing of it is ours any more."""
        with self._lock:
            batch = self._open.pop(name, None)
            for job_id in batch.unresolved if batch else ():
                self._batch_of.pop(job_id, None)
                self._tickets.pop(job_id, None)

    def blocked_from(self) -> int | None:
        """The first shard holding a row of a batch still claimed: recovery must read from it on
        (its job ids tell which jobs of the batch are done), so `dropped_through` stays below."""
        with self._lock:
            seqs = [b.first_shard for b in self._open.values() if b.first_shard is not None]
        return min(seqs) if seqs else None


class BatchClaims:
    """The batch files in one worker's claim directory and the moves of their jobs.

    A job of a held batch has no file of its own until it needs one: it leaves the claim
    directory (a hand-off to a queue, a give-back, a requeue) as its own ticket, written here,
    recorded in the hand-off log, then renamed (orchestrator/spool/handoffs.py); its row committed
    resolves it too. The batch file is unlinked with its last job.
    """

    def __init__(self, box: ClaimBox, shards: ShardWriter) -> None:
        self.box = box
        self.shards = shards
        self.held = HeldBatches()
        self.handoffs = HandoffLog(box.dir)
        self.own_files: set[str] = set()      # jobs of held batches that have their own ticket file here
        self.singles_dropped_through = 0      # dropped_through as the single tickets alone allow
        self.emptied: set[str] = set()        # batch files with every job resolved, not unlinked yet

    def take(self, name: str) -> list[Ticket] | None:
        """Read a batch file just claimed and hold it; None when corrupt (quarantined by the box)."""
        tickets = self.box.load_batch(name)
        if tickets is not None:
            self.held.hold(name, tickets)
        return tickets

    def holds(self, job_id: str) -> bool:
        return self.held.batch_of(job_id) is not None

    def leave(self, ticket: Ticket, queue: Path) -> None:
        """Save the job as its own ticket, record the hand-off, then rename it into `queue`."""
        self.box.save(ticket)
        self.own_files.add(ticket.name)
        self.handoffs.record(ticket.name)
        fsops.replace(self.box.dir / ticket.name, queue / ticket.name)
        self.own_files.discard(ticket.name)
        self.resolve(ticket.name, None)

    def leave_by_requeue(self, ticket: Ticket) -> None:
        """Before recovery.requeue_claim moves the job out: its own ticket here, the hand-off recorded."""
        if ticket.name not in self.own_files:
            self.box.save(ticket)
        self.handoffs.record(ticket.name)
        self.own_files.discard(ticket.name)
        self.resolve(ticket.name, None)

    def give_back_whole(self, name: str, queue: Path) -> bool:
        """A batch none of whose jobs started goes back unchanged, one rename; False otherwise."""
        if self.held.started(name) or not self.box.release(name, queue):
            return False
        self.held.forget(name)
        return True

    def resolve(self, job_id: str, shard_seq: int | None) -> None:
        """One job of a held batch is done with (row in shard `shard_seq`, or handed off)."""
        emptied = self.held.resolve(job_id, shard_seq)
        if emptied is not None:
            self.emptied.add(emptied)
            self.drop_emptied()

    def drop_emptied(self) -> None:
        """Unlink the batch files all of whose jobs are resolved (again after an error unlinking one)."""
        for name in sorted(self.emptied):
            self.box.drop(name)
            self.emptied.discard(name)
        self.publish_dropped_through()

    def committed(self, job_ids: list[str], shard_seq: int) -> None:
        """The rows of `job_ids` are durable in shard `shard_seq`: drop their claims."""
        for job_id in job_ids:
            if not self.holds(job_id):
                self.box.drop(job_id)
                continue
            if job_id in self.own_files:
                self.box.drop(job_id)
                self.own_files.discard(job_id)
            self.resolve(job_id, shard_seq)
        if self.singles_dropped_through == shard_seq - 1:   # no earlier shard left tickets behind
            self.singles_dropped_through = shard_seq
        self.publish_dropped_through()

    def publish_dropped_through(self) -> None:
        """What recovery may skip (the heartbeat publishes it): shards all of whose claims are gone
        from the claim directory, i.e. single tickets dropped and no held batch with a row in them."""
        if self.emptied:   # a batch file still here may have rows in any shard: recovery reads them all
            return
        blocked = self.held.blocked_from()
        limit = self.singles_dropped_through if blocked is None else min(self.singles_dropped_through, blocked - 1)
        self.shards.dropped_through = max(self.shards.dropped_through, limit)

    def close(self, stopped_cleanly: bool) -> None:
        if stopped_cleanly and not self.held.names() and not self.emptied:
            self.handoffs.remove()   # nothing of a batch left to account for
        self.handoffs.close()
