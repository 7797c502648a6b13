"""How far the jobs are, each counted once from submission to shard: the numbers of a progress bar.

    total   the jobs submitted (the submission records' `jobs`: accepted rows x samples; a rejected
            row queues none) that had no row when watching began
    done    the rows committed since (a job has one row: recovery never writes a second one)

Never counted from the queues: a job is in a claimed batch and in the run or eval queue at once
until its batch is resolved, and a retried or requeued job comes back to a queue, so tickets
count some jobs twice (a 20-job submission showed 4/24 and 12/24, issue 39). The queues still
say whether anything is left (orchestrator/report/status.py `pending_count`).

Cost: when watching begins, one footer read per committed shard (its row count, no column); then
per look one listing of submissions/ plus each new record once, and what RowTally reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from orchestrator.report.tally import RowTally
from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shard_reader import READ_ERRORS, open_shard


@dataclass(frozen=True)
class JobCount:
    done: int
    total: int


@dataclass
class SubmittedJobs:
    """Jobs queued by every `submit` so far, from submissions/*.json (each record read once)."""

    paths: SpoolPaths
    _jobs: dict[str, int] = field(default_factory=dict)

    def refresh(self) -> int:
        for name in fsops.list_names(self.paths.submissions):
            if name.endswith(".json") and name not in self._jobs:
                jobs = _recorded_jobs(self.paths, name)
                if jobs is not None:   # else: read again at the next look
                    self._jobs[name] = jobs
        return sum(self._jobs.values())


def _recorded_jobs(paths: SpoolPaths, name: str) -> int | None:
    try:
        record = orjson.loads(fsops.read_bytes(paths.submissions / name))
        return max(int(record.get("jobs") or 0), 0)
    except (OSError, orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        return None


def rows_in(paths: SpoolPaths, shard_names: Iterable[str]) -> int:
    """Rows of committed shards, from their footers; an unreadable shard has none (its jobs have
    lost their rows: orchestrator/spool/quarantine.py)."""
    count = 0
    for name in shard_names:
        try:
            count += open_shard(paths.shards / name).metadata.num_rows
        except READ_ERRORS:
            continue
    return count


@dataclass
class JobProgress:
    """Start with `JobProgress.from_now(paths)`; each `look()` refreshes the tally it shares."""

    tally: RowTally
    submitted: SubmittedJobs
    finished_before: int   # rows already committed when watching began

    @classmethod
    def from_now(cls, paths: SpoolPaths) -> "JobProgress":
        tally = RowTally.from_now(paths)
        return cls(tally, SubmittedJobs(paths), rows_in(paths, tally.seen))

    def look(self) -> JobCount:
        # `submit` records a submission once its jobs are queued: a fast row may come first,
        # and the count then leads the total for a moment.
        submitted = self.submitted.refresh()
        self.tally.refresh()
        done = self.tally.done
        return JobCount(done, max(submitted - self.finished_before, done))
