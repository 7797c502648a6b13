"""Idle exit: a worker with nothing to do for `idle_exit_s` gives its node back.

The clock restarts whenever the worker holds anything (a running stage, a job it prepared
waiting in its node's run queue, rows not yet committed to a shard) and whenever it claimed
something since the last look, so a job shorter than the polling period still counts. When it runs out, the
queues the worker claims from are listed once more, so a job submitted just before the
deadline is still claimed and run (the clock restarts); only with every queue empty does the
worker leave. Leaving is an ordinary clean stop: shards committed, heartbeat retired, exit 0,
so a Slurm array task ends COMPLETED and is never requeued.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from orchestrator.spool import fsops

# How often the worker looks at its idle clock: a fraction of the window, at most a second.
MAX_POLL_S = 1.0


def poll_period(idle_exit_s: float, heartbeat_s: float) -> float:
    """Check often enough that a worker leaves within idle_exit_s plus a heartbeat."""
    return max(0.05, min(MAX_POLL_S, heartbeat_s, idle_exit_s / 4))


@dataclass
class IdleClock:
    """Time since the worker last held anything; `expired` says when it may leave."""

    idle_exit_s: float
    clock: Callable[[], float] = time.monotonic
    busy_at: float = field(default=0.0)
    claims_seen: int = field(default=0)

    def __post_init__(self) -> None:
        self.busy_at = self.clock()

    @property
    def enabled(self) -> bool:
        return self.idle_exit_s > 0

    def idle_for(self) -> float:
        return self.clock() - self.busy_at

    def observe(self, holding: bool, claims: int | None = None) -> None:
        """Record whether the worker holds anything now, and its claim count so far."""
        if claims is not None and claims != self.claims_seen:
            self.claims_seen, holding = claims, True
        if holding:
            self.busy_at = self.clock()

    def expired(self, holding: bool, queues: Iterable[Path], claims: int | None = None) -> bool:
        """True when the worker may leave: idle for the whole window and nothing left to claim.

        The queues are listed only once the window has run out (one listing per queue),
        so an idle worker costs the metadata server nothing until its deadline.
        """
        self.observe(holding, claims)
        if not self.enabled or self.idle_for() < self.idle_exit_s:
            return False
        if any(fsops.list_names(queue) for queue in queues):
            self.observe(True)   # work arrived at the last moment: claim it, start over
            return False
        return True
