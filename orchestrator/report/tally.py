"""How the jobs finished while someone watched: rows committed since a starting point, by status.

Reads only the shards it has not read yet (two small columns each), so polling it every
half second costs one directory listing plus the new shards.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


from orchestrator.spool.jobs import JobStatus
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shard_reader import READ_ERRORS, read_shard_table, shard_names, unreadable_because, warn_skipped

# Statuses that make `launch --wait` exit non-zero (cancelled is what the user asked for).
FAILURES = (JobStatus.FAILED.value, JobStatus.TIMEOUT.value)


@dataclass
class RowTally:
    paths: SpoolPaths
    seen: set[str] = field(default_factory=set)
    by_status: Counter[str] = field(default_factory=Counter)
    retried: int = 0          # rows of jobs that needed more than one attempt

    @classmethod
    def from_now(cls, paths: SpoolPaths) -> "RowTally":
        """Count only rows committed from now on."""
        return cls(paths, seen=set(shard_names(paths)))

    def refresh(self) -> None:
        for name in shard_names(self.paths):
            if name in self.seen:
                continue
            self.seen.add(name)
            try:
                table = read_shard_table(self.paths.shards / name, ["status", "attempt"])
            except READ_ERRORS as exc:
                warn_skipped(name, unreadable_because(exc))
                continue
            self.by_status.update(table.column("status").to_pylist())
            self.retried += sum(1 for attempt in table.column("attempt").to_pylist() if (attempt or 1) > 1)

    @property
    def done(self) -> int:
        return sum(self.by_status.values())

    @property
    def failed(self) -> int:
        return sum(self.by_status[s] for s in FAILURES)

    def summary(self) -> str:
        """E.g. '18 ok, 2 failed, 1 cancelled (3 retried)'."""
        parts = [f"{self.by_status['ok']} ok"]
        parts += [f"{count} {status}" for status, count in sorted(self.by_status.items()) if status != "ok" and count]
        return ", ".join(parts) + (f" ({self.retried} retried)" if self.retried else "")
