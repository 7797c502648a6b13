"""Claiming tickets from queue directories, and moving them on: all by atomic rename.

A claim is `rename(queue/X/JOB, active/W/JOB)`: exactly one worker wins, on any filesystem.
The claim's lease is the worker's heartbeat file; see orchestrator/spool/recovery.py.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from pathlib import Path
from typing import Callable

from orchestrator.spool import fsops
from orchestrator.spool.access import read_trusted
from orchestrator.spool.batches import decode_batch
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.tickets import CorruptTicket, Ticket

log = logging.getLogger(__name__)

# Workers start claiming at a random point among the oldest START_WINDOW tickets, and jump
# ahead after losing a race, so that they rarely fight over the same ticket.
START_WINDOW = 255
SKIP_AFTER_LOST_RACE = 31
# With many claimers the window widens (this many tickets per claimer): 100 workers starting in
# the same 255 tickets lost a race on most claims (docs/scale.md).
START_SPREAD_PER_CLAIMER = 64
CLAIM_DUTY = "claim"
IDLE_POLL_DUTY = "idle_poll"


class Claimer:
    """Claims tickets from one queue directory into one claim directory.

    The directory listing is cached and consumed in order, so a claim costs one rename no
    matter how many tickets are queued; the listing is refreshed only when the cache runs dry.
    Workers start at a random point near the head and jump ahead after losing a race, which
    keeps them from all fighting over the same first ticket.
    """

    def __init__(self, queue: Path, claims: Path, min_relist_s: float = 0.02) -> None:
        self.queue = queue
        self.claims = claims
        self.min_relist_s = min_relist_s
        self.claimers = 1   # workers claiming from this queue, as far as this one knows
        self._candidates: deque[str] = deque()
        self._hints: deque[str] = deque()
        self._listed_at = 0.0
        # Small runs: each listing also stats the queue directory, for queue_changed (the dispatcher
        # sets it; large runs learn of new tickets from the cluster summary instead).
        self.watch = False
        self._listed_identity: tuple[int, int, int] | None = None   # the queue directory's, at the last listing

    @property
    def hinted(self) -> bool:
        """Names this worker queued itself wait to be claimed (no listing needed to find them)."""
        return bool(self._hints)

    def claim(self) -> str | None:
        """Name of a ticket now in the claim directory, or None when the queue looks empty.

        The operations of a claim are charged to the "claim" duty of fsops; those of an
        attempt that found nothing to an "idle_poll" (a cost per second, not per job).
        """
        ops, names = fsops.BY_DUTY[CLAIM_DUTY], fsops.BY_DUTY[f"{CLAIM_DUTY}:names"]
        with fsops.duty(CLAIM_DUTY):
            name = self._claim()
        if name is None:
            fsops.recharge(CLAIM_DUTY, IDLE_POLL_DUTY, fsops.BY_DUTY[CLAIM_DUTY] - ops,
                           fsops.BY_DUTY[f"{CLAIM_DUTY}:names"] - names)
        return name

    def _claim(self) -> str | None:
        while self._hints:
            name = self._hints.popleft()
            if fsops.rename(self.queue / name, self.claims / name):
                return name
        if not self._candidates:
            self._relist()
        while self._candidates:
            name = self._candidates.popleft()
            if fsops.rename(self.queue / name, self.claims / name):
                return name
            self._skip(random.randint(1, SKIP_AFTER_LOST_RACE))
        return None

    def hint(self, name: str) -> None:
        """This process just queued `name`: try it first, without listing the directory."""
        self._hints.append(name)

    def queue_changed(self) -> bool:
        """Whether the queue directory changed since its last listing (one stat): a ticket may have
        come. A hint only (a filesystem may show a directory's change late): listings go on regardless.
        When it did, the next claim lists the queue again at once."""
        if self._listed_identity is None or fsops.identity(self.queue) == self._listed_identity:
            return False
        self.forget()
        return True

    def forget(self) -> None:
        """Drop the cached listing (e.g. after this process put tickets back)."""
        self._candidates.clear()
        self._listed_at = 0.0

    def _relist(self) -> None:
        now = time.monotonic()
        if now - self._listed_at < self.min_relist_s:
            return
        self._listed_at = now
        # Before listing: a ticket added during the listing changes it.
        self._listed_identity = fsops.identity(self.queue) if self.watch else None
        names = sorted(fsops.list_names(self.queue))
        if len(names) > 1:
            window = max(START_WINDOW, START_SPREAD_PER_CLAIMER * self.claimers)
            start = random.randint(0, min(len(names) - 1, window))
            names = names[start:] + names[:start]
        self._candidates = deque(names)

    def _skip(self, n: int) -> None:
        for _ in range(min(n, len(self._candidates))):
            self._candidates.append(self._candidates.popleft())


class ClaimBox:
    """A worker's claim directory (active/W/) and the transitions of the tickets in it.

    A claimed file is decoded only when its owner is one the run trusts (orchestrator/spool/access.py);
    it is quarantined, never deleted, when it is not or cannot be decoded, and `on_quarantine` is told why.
    """

    def __init__(self, paths: SpoolPaths, worker_id: str,
                 on_quarantine: Callable[[str, str], None] | None = None) -> None:
        self.paths = paths
        self.dir = paths.claims(worker_id)
        self.on_quarantine = on_quarantine
        fsops.ensure_dir(self.dir)

    def claimer(self, queue: Path) -> Claimer:
        return Claimer(queue, self.dir)

    def load(self, name: str) -> Ticket | None:
        """Decode a claimed ticket; a corrupt or untrusted one (or a directory) is quarantined and None returned."""
        data = self._read(name)
        try:
            return None if data is None else Ticket.decode(data, name)
        except (CorruptTicket, UnicodeError) as exc:
            self._quarantine(name, f"{self.dir / name}: {exc}")
            return None

    def load_batch(self, name: str) -> list[Ticket] | None:
        """Decode a claimed batch file; a corrupt or untrusted one is quarantined (never deleted) and None returned."""
        data = self._read(name)
        try:
            return None if data is None else decode_batch(data, name)
        except (CorruptTicket, UnicodeError) as exc:
            self._quarantine(name, f"{self.dir / name}: {exc}")
            return None

    def _read(self, name: str) -> bytes | None:
        data, refusal = read_trusted(self.paths, self.dir / name)
        if refusal:
            self._quarantine(name, refusal)
            return None
        return data

    def _quarantine(self, name: str, reason: str) -> None:
        fsops.quarantine(self.dir / name, self.paths.quarantine, reason)
        log.warning("quarantined %s: %s", name, reason)
        if self.on_quarantine is not None:
            self.on_quarantine(name, reason)

    def save(self, ticket: Ticket) -> None:
        """Replace the claimed copy with `ticket`'s current content (atomic)."""
        fsops.write_atomic(self.dir / ticket.name, ticket.encode(), self.paths.tmp)

    def advance(self, ticket: Ticket, queue: Path) -> None:
        """Save the ticket's new content, then hand it to `queue`.

        The claimed copy is overwritten first so a crash between the two steps leaves a
        claim whose content already says what comes next: recovery routes it on, never twice.
        """
        self.save(ticket)
        fsops.replace(self.dir / ticket.name, queue / ticket.name)

    def release(self, name: str, queue: Path) -> bool:
        """Give a claimed ticket back unchanged (it was not started)."""
        return fsops.rename(self.dir / name, queue / name)

    def drop(self, name: str) -> None:
        """The job's row is committed: the ticket has served its purpose."""
        fsops.unlink(self.dir / name)

    def names(self) -> list[str]:
        return sorted(fsops.list_names(self.dir))

