"""A trainer step waiting on rows that do not come says so, and says whether anyone is working.

A step with no time limit waits for every sample's row (verl's `generate_sequences`, TRL's
rollout function). With no worker launched, or a Slurm array still pending, that wait used to be
silent. After `after_s` with no new row the wait logs a warning naming what is missing and how
many workers are alive (the reader's view of their heartbeats), with the command that starts
some or shows them; again when the silence has lasted twice as long, and so on (60, 120, 240 s).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from orchestrator.config import RunConfig
from orchestrator.spool.liveness import read_workers
from orchestrator.spool.paths import SpoolPaths

log = logging.getLogger(__name__)

STALL_WARN_S = 60.0


@dataclass
class StallNotice:
    paths: SpoolPaths
    started: float                    # time.monotonic() when the wait began
    after_s: float = STALL_WARN_S
    _last_row: float = field(init=False)
    _quiet_s: float = field(init=False)   # the silence that triggers the next warning

    def __post_init__(self) -> None:
        self._last_row, self._quiet_s = self.started, self.after_s

    def rows_came(self, now: float) -> None:
        self._last_row, self._quiet_s = now, self.after_s

    def check(self, now: float, missing: int, size: int) -> None:
        """Warn when no row has come for the current quiet period (then wait twice as long)."""
        quiet = now - self._last_row
        if missing <= 0 or quiet < self._quiet_s:
            return
        self._quiet_s *= 2
        log.warning("hpc-rollout: the step has had no new row for %.1f s (%d of %d samples missing): %s",
                    quiet, missing, size, self.who_works())

    def who_works(self) -> str:
        try:
            lease_s = RunConfig.load(self.paths.run_config).leases.lease_s
            alive = [w for w in read_workers(self.paths, lease_s) if w.alive]
        except Exception as exc:   # a warning must not end the step; say what could not be read
            return f"could not read the workers of {self.paths.root} ({exc})"
        if not alive:
            return (f"no live worker on {self.paths.root}: start some with `hpc-rollout launch {self.paths.root} "
                    "--local --workers 2` (or `--nodes N` on Slurm; a pending array shows in `squeue --me`)")
        return (f"{len(alive)} live worker(s), but no row of the step since; see what they hold with "
                f"`hpc-rollout status {self.paths.root}`")
