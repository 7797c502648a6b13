"""Where INIT's next job comes from when resource classes are in force (worker/admission.py).

Without classes the INIT dispatcher claims queue/init's entries in order (spool/claims.py). With
them it must see past the head: a short job queued behind a hundred long ones would otherwise
wait for all of them. So it lists the queue, learns the class of each of the oldest LOOK_AHEAD
entries by reading it once (a job is immutable: the class of a name never changes, so a worker
reads an entry at most once; `submit` keeps a batch to one class, so its first job tells), and
claims the entry the admission rule picks, by the same atomic rename. Jobs of a claimed batch
wait here in memory (as without classes) and are picked one by one by the same rule.

The queue is listed again when its directory changed (a stat), else at most every RELIST_S.
"""

from __future__ import annotations

import logging
import time

from orchestrator.resource_class import ResourceClass
from orchestrator.spool import fsops
from orchestrator.spool.batches import is_batch, read_entry
from orchestrator.spool.claims import CLAIM_DUTY, IDLE_POLL_DUTY
from orchestrator.spool.jobs import Stage
from orchestrator.worker.admission import Admission, Candidate
from orchestrator.worker.job_runner import JobRunner
from orchestrator.worker.moves import TicketMoves
from orchestrator.worker.state import Slot, WorkerState

log = logging.getLogger(__name__)

LOOK_AHEAD = 256      # queue entries whose class the dispatcher knows (each up to jobs.batch_size jobs)
RELIST_S = 1.0        # list queue/init at least this often while looking for work, changed or not
MAX_LOST_RACES = 8    # claims lost to other workers in one pick before waiting for the next round


class ClassClaims:
    def __init__(self, state: WorkerState, runner: JobRunner, moves: TicketMoves, admission: Admission) -> None:
        self.state = state
        self.runner = runner
        self.moves = moves
        self.admission = admission
        self._class_of: dict[str, ResourceClass] = {}   # queue entry -> its class (read once)
        self._queued: list[str] = []                     # the oldest entries, as last listed
        self._listed_at = 0.0
        self._listed_identity: tuple[int, int, int] | None = None

    def start_next(self, slot: Slot) -> bool:
        """Start INIT of the job the admission rule picks on `slot` (of INIT); False when no ready
        class fits now (the slot is the caller's again)."""
        state = self.state
        for _ in range(MAX_LOST_RACES):
            choice = self.admission.choose(self._candidates())
            if choice is None:
                return False
            if choice.name in state.jobs.waiting_init:   # a job of a batch claimed here
                self.admission.reserve(choice.name, choice.job_class)
                self.runner.start_waiting(slot, name=choice.name)
                return True
            self._queued.remove(choice.name)
            with fsops.duty(CLAIM_DUTY):
                claimed = fsops.rename(state.paths.init_queue / choice.name, state.box.dir / choice.name)
            if not claimed:
                continue   # another worker was first: pick again
            if is_batch(choice.name):
                self.moves.take_batch(choice.name)   # its jobs wait here; the next round picks among them
                continue
            self.admission.reserve(choice.name, choice.job_class)
            self.runner.start(Stage.INIT, choice.name, slot)
            return True
        return False

    def _candidates(self) -> list[Candidate]:
        """The oldest job of each ready class: held here first (claimed already), else queued."""
        ready: dict[str, Candidate] = {}
        for name, ticket in self.state.jobs.waiting_init.items():
            job_class = self.admission.class_of(ticket.job)
            ready.setdefault(job_class.name, Candidate(name, job_class))
        with fsops.duty(IDLE_POLL_DUTY):
            self._refresh()
            for name in list(self._queued):
                queued_class = self._entry_class(name)
                if queued_class is not None:
                    ready.setdefault(queued_class.name, Candidate(name, queued_class))
        return list(ready.values())

    def _refresh(self) -> None:
        queue = self.state.paths.init_queue
        identity = fsops.identity(queue)
        if identity == self._listed_identity and time.monotonic() - self._listed_at < RELIST_S:
            return
        self._listed_identity, self._listed_at = identity, time.monotonic()
        self._queued = sorted(fsops.list_names(queue))[:LOOK_AHEAD]
        listed = set(self._queued)
        self._class_of = {name: c for name, c in self._class_of.items() if name in listed}

    def _entry_class(self, name: str) -> ResourceClass | None:
        """The class of a queued entry (its first job's); None when it is gone (claimed meanwhile)."""
        known = self._class_of.get(name)
        if known is not None:
            return known
        try:
            tickets = read_entry(self.state.paths.init_queue / name)
        except FileNotFoundError:
            self._queued.remove(name)
            return None
        except Exception as exc:  # noqa: BLE001 - unreadable: claimed like any, quarantined by the claim's read
            log.debug("queue entry %s: class unreadable (%s): the default class", name, exc)
            tickets = []
        job_class = self.admission.class_of(tickets[0].job) if tickets else self.admission.default
        self._class_of[name] = job_class
        return job_class
