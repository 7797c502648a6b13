"""Idle exit: a worker with nothing to do for `idle_exit_s` gives its node back.

The clock restarts whenever the worker holds anything (a running stage, a job it prepared
waiting in its node's run queue, rows not yet committed to a shard) and whenever it claimed
something since the last look, so a job shorter than the polling period still counts. When it runs out, the
queues the worker claims from are listed once more, so a job submitted just before the
deadline is still claimed and run (the clock restarts); only with every queue empty does the
worker leave. Leaving is an ordinary clean stop: shards committed, heartbeat retired, exit 0,
so a Slurm array task ends COMPLETED and is never requeued.

A worker started by a launcher that waits on it (`launch --local --wait`, `demo`) knows that
launcher's pid. Should the launcher die without passing a signal on (SIGKILL, a crash), the
worker's parent changes; from then on the window is at most ORPHAN_IDLE_EXIT_S: it finishes
what is queued (the work it was started for) and leaves, rather than running on with nobody left
to stop it. Detached workers (`launch --local` without --wait, Slurm) have no launcher to lose.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from orchestrator.spool import fsops

log = logging.getLogger(__name__)

# How often the worker looks at its idle clock: a fraction of the window, at most a second.
MAX_POLL_S = 1.0
# Once its launcher is gone: a few polls of quiet (a job moving between workers' stages is seen), then leave.
ORPHAN_IDLE_EXIT_S = 5.0


def poll_period(idle_exit_s: float, heartbeat_s: float) -> float:
    """Check often enough that a worker leaves within idle_exit_s plus a heartbeat."""
    return max(0.05, min(MAX_POLL_S, heartbeat_s, idle_exit_s / 4))


def launcher_gone(launcher_pid: int) -> Callable[[], bool]:
    """True once the launcher that started this process is no longer its parent (it died; the
    process was re-parented). A parent pid cannot be reused while this process is its child."""
    return lambda: os.getppid() != launcher_pid


@dataclass
class IdleClock:
    """Time since the worker last held anything; `expired` says when it may leave."""

    idle_exit_s: float
    clock: Callable[[], float] = time.monotonic
    busy_at: float = field(default=0.0)
    claims_seen: int = field(default=0)
    orphaned: Callable[[], bool] | None = None   # the launcher waiting on this worker is gone
    _orphan_noted: bool = field(default=False)

    def __post_init__(self) -> None:
        self.busy_at = self.clock()

    @property
    def enabled(self) -> bool:
        return self.idle_exit_s > 0 or self.orphaned is not None

    @property
    def shortest_window_s(self) -> float:
        """The shortest window that may apply (sets how often the clock is looked at)."""
        windows = [w for w in (self.idle_exit_s, ORPHAN_IDLE_EXIT_S if self.orphaned else 0.0) if w > 0]
        return min(windows, default=0.0)

    def window_s(self) -> float:
        """The idle time after which the worker may leave now (inf: never)."""
        window = self.idle_exit_s if self.idle_exit_s > 0 else float("inf")
        if self.orphaned is not None and self.orphaned():
            if not self._orphan_noted:
                self._orphan_noted = True
                log.warning("the launcher that waited on this worker is gone: leaving once nothing is left to claim")
            window = min(window, ORPHAN_IDLE_EXIT_S)
        return window

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
        if not self.enabled or self.idle_for() < self.window_s():
            return False
        if any(fsops.list_names(queue) for queue in queues):
            self.observe(True)   # work arrived at the last moment: claim it, start over
            return False
        return True
