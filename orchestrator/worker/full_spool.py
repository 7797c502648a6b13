"""A full spool is the infrastructure's fault, not the job's: it costs the job no attempt.

A job's stage is lost to a full spool when a write the engine makes for it fails with ENOSPC or
EDQUOT (its ticket saved on the way to the next queue, its RUN output journaled), or when its
handler's own write fails so on the spool's filesystem (the job's directory, a host workspace bound
from it). Its task then keeps the claim and its pool slot (the worker takes no new work meanwhile)
and gives the job back to where it can resume once the spool takes the ticket again, retrying with
the shard commits' backoff (0.5 s doubling to 30 s). While the spool stays full the job waits:
nothing could record its end anyway, its row goes to the same spool.

The bound: a job is given back with its attempt unchanged for its first FREE_LOSSES such losses;
each one beyond is charged like an engine error (Ticket.return_after_infrastructure_loss), so a
spool that fills up again and again still ends it, `failed`, after FREE_LOSSES + jobs.max_attempts
losses. A worker stopped while the spool is still full leaves the claim to its stop, which
requeues it charged, as before.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from pathlib import Path

from orchestrator.spool.jobs import Stage, StageError
from orchestrator.spool.tickets import Ticket
from orchestrator.worker.moves import TicketMoves
from orchestrator.worker.state import WorkerState

log = logging.getLogger(__name__)

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
FREE_LOSSES = 10                 # full-spool losses per job not charged as attempts
RETRY_S = (0.5, 30.0)            # first and longest wait between tries to give the job back
NEARLY_FULL_BYTES = 1 << 20      # a disk-full error naming no file is the spool's when it has less room


def disk_full_error(exc: BaseException) -> OSError | None:
    """The ENOSPC or EDQUOT error behind `exc` (itself, or what it was raised from), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            return current
        current = current.__cause__ or current.__context__
    return None


def fills_the_spool(error: OSError, spool: Path) -> bool:
    """Whether a disk-full error a handler raised is the spool's: it names a file on the spool's
    filesystem, or names none (a write to an open file) while the spool has almost no room left.
    A quota (EDQUOT) naming no file is taken as the spool's: free space does not show it, and the
    quotas of a cluster are on its shared filesystems."""
    named = [Path(os.fsdecode(name)) for name in (error.filename, error.filename2)
             if isinstance(name, (str, bytes, os.PathLike))]
    if named:
        return any(_same_filesystem(path, spool) for path in named)
    if error.errno == errno.EDQUOT:
        return True
    try:
        room = os.statvfs(spool)
    except OSError:
        return False
    return room.f_bavail * room.f_frsize < NEARLY_FULL_BYTES


def _same_filesystem(path: Path, spool: Path) -> bool:
    """`path` (or, when it does not exist, its nearest existing parent) is on the spool's filesystem."""
    path = path.absolute()
    for candidate in (path, *path.parents):
        try:
            return os.stat(candidate).st_dev == os.stat(spool).st_dev
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return False


class FullSpoolReturn:
    """Gives back the jobs whose stage a full spool cut short, without charging them an attempt."""

    def __init__(self, state: WorkerState, moves: TicketMoves) -> None:
        self.state = state
        self.moves = moves

    async def give_back(self, name: str, stage: Stage, error: OSError) -> None:
        """Send job `name` back to where it can resume once the spool has room (see the module)."""
        state = self.state
        ticket = state.jobs.in_flight.get(name)
        if ticket is None:   # the loss came before its stage had its ticket: nothing to keep
            self.moves.requeue_claim(name, f"the spool is full in {stage.value}: {error}")
            return
        max_attempts = state.config.jobs.max_attempts
        cause = f"the spool is full in {stage.value} ({error.strerror or error})"
        exhausted = StageError(stage.value, "attempts_exhausted", f"{cause}; gave up after {FREE_LOSSES} losses "
                                                                   f"to a full spool and {max_attempts} attempts")
        charged = ticket.return_after_infrastructure_loss(cause, FREE_LOSSES, exhausted.to_record(), max_attempts)
        queue = state.queue_of(ticket.stage)
        log.warning("job %s: %s; it goes back to %s once there is room, attempt %d %s", name, cause, queue.name,
                    ticket.attempt, "charged: its losses to a full spool are used up" if charged else "not charged")
        started = time.monotonic()
        if not await self._move_when_room(ticket, queue):
            return
        waited_s = round(time.monotonic() - started, 3)
        log.info("job %s: back in %s after waiting %.1fs for room on the spool", name, queue.name, waited_s)
        state.events.emit(name, "spool_full_requeued", {"stage": stage.value, "to": ticket.stage.value,
                                                        "attempt": ticket.attempt, "charged": charged,
                                                        "waited_s": waited_s})
        state.claimers[Stage.INIT].forget()
        state.requeued(1)

    async def _move_when_room(self, ticket: Ticket, queue: Path) -> bool:
        """Move the ticket to `queue` as soon as the spool takes it; False when it is not ours to move
        any more (the lease is lost) or another error stops it (the claim audit then requeues it)."""
        state = self.state
        delay = RETRY_S[0]
        while not state.lease_lost:
            try:
                self.moves.move_out(ticket, queue)
                return True
            except OSError as exc:
                if disk_full_error(exc) is None:
                    log.error("job %s: could not give it back after the full spool (%s); the claim audit will "
                              "try again", ticket.name, exc)
                    return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_S[1])
        return False
