"""How many node workers a run needs now: the pure decision behind `hpc-rollout adapt`.

Inputs are counts (jobs nobody has claimed, tasks running and pending in Slurm); the output
is one action. Workers leave by themselves when idle (idle exit), so the controller only ever
adds workers or withdraws tasks that have not started: it never stops a worker that holds
work. The first `minimum` workers are launched without idle exit and stay.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class Action(enum.Enum):
    HOLD = "hold"
    GROW = "grow"            # submit `count` more workers
    WITHDRAW = "withdraw"    # cancel `count` PENDING tasks (they hold no node and no work)


@dataclass(frozen=True)
class Bounds:
    minimum: int
    maximum: int
    slots_per_worker: int    # jobs one worker takes at once (its RUN pool, or EVAL pool for eval workers)
    cooldown_s: float        # no change of direction sooner than this after the last change

    def __post_init__(self) -> None:
        if self.minimum < 0 or self.maximum < 1 or self.minimum > self.maximum:
            raise ValueError(f"need 0 <= --min <= --max and --max >= 1, got --min {self.minimum} --max {self.maximum}")
        if self.slots_per_worker < 1:
            raise ValueError("workers need at least one slot in the pool they are scaled for")


@dataclass(frozen=True)
class Observation:
    backlog: int             # jobs in the shared queues these workers claim from, unclaimed
    running: int             # tasks holding a node (RUNNING, COMPLETING...)
    pending: int             # tasks waiting for Slurm (PENDING)
    kept: int                # of running + pending: workers without idle exit (the minimum)

    @property
    def current(self) -> int:
        return self.running + self.pending


@dataclass(frozen=True)
class Decision:
    action: Action
    count: int               # workers to add or pending tasks to withdraw
    target: int              # workers wanted after the action
    keep: bool               # GROW: launch them without idle exit (they make up the minimum)
    reason: str


def target(bounds: Bounds, seen: Observation) -> int:
    """Workers wanted: enough new ones for the backlog, none beyond what runs when there is none."""
    wanted = seen.running
    if seen.backlog > 0:
        wanted += max(seen.pending, math.ceil(seen.backlog / bounds.slots_per_worker))
    return min(bounds.maximum, max(bounds.minimum, wanted))


def decide(bounds: Bounds, seen: Observation, since_last_change_s: float | None) -> Decision:
    """One step: GROW, WITHDRAW or HOLD. `since_last_change_s` None: no change made yet."""
    goal = target(bounds, seen)
    if seen.kept < bounds.minimum and seen.current < bounds.maximum:
        count = min(bounds.minimum - seen.kept, bounds.maximum - seen.current)
        return Decision(Action.GROW, count, goal, True, f"{seen.kept} of the --min {bounds.minimum} kept workers")
    cooling = since_last_change_s is not None and since_last_change_s < bounds.cooldown_s
    if goal > seen.current:
        if cooling:
            return Decision(Action.HOLD, 0, goal, False, f"cool-down: {goal - seen.current} more wanted")
        return Decision(Action.GROW, goal - seen.current, goal, False,
                        f"{seen.backlog} job(s) unclaimed, {seen.running} running, {seen.pending} pending")
    if goal < seen.current and seen.pending > 0:
        surplus = min(seen.pending, seen.current - goal)
        if cooling:
            return Decision(Action.HOLD, 0, goal, False, f"cool-down: {surplus} pending task(s) not needed")
        return Decision(Action.WITHDRAW, surplus, goal, False,
                        f"{seen.backlog} job(s) unclaimed: {surplus} pending task(s) not needed")
    why = "over --max: workers leave when idle" if seen.running > goal else "steady: idle workers leave by themselves"
    return Decision(Action.HOLD, 0, goal, False, why)
