"""The Python API for trainers: submit, cancel, read finished trajectories with a cursor.

    from orchestrator.api import Spool
    spool = Spool.create("spool/run1")
    spool.submit([{"messages": [...], "user_turns": [...]}], handler="chat", samples=8)
    reader = spool.reader()                       # resumable: reader.cursor survives restarts
    for group in reader.groups(follow=True):      # only complete groups (all samples finished)
        train_on(group)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from orchestrator.cancel import request_cancel
from orchestrator.config import RunConfig
from orchestrator.paths import SpoolPaths
from orchestrator.shards import iter_rows
from orchestrator.spool import init_run, open_run
from orchestrator.status import Snapshot, snapshot
from orchestrator.submit import SubmitReport, submit_file, submit_rows


@dataclass
class RowReader:
    """Rows of committed shards in commit order; `cursor` is the last shard consumed."""

    paths: SpoolPaths
    cursor: str | None = None
    poll_s: float = 0.5
    _partial: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def rows(self, follow: bool = False) -> Iterator[dict[str, Any]]:
        while True:
            for name, rows in iter_rows(self.paths, self.cursor):
                yield from rows
                self.cursor = name
            if not follow:
                return
            time.sleep(self.poll_s)

    def groups(self, follow: bool = False) -> Iterator[list[dict[str, Any]]]:
        """Whole groups only: yielded once every sample of the group has its row.

        Samples of a group still missing when the reader stops are kept in memory, not lost
        from the reader's point of view, but a new reader resuming from `cursor` will not
        see rows of shards before its cursor: persist the cursor only between groups.
        """
        for row in self.rows(follow):
            members = self._partial.setdefault(row["group_id"], [])
            members.append(row)
            if len(members) >= (row.get("group_size") or 1):
                yield sorted(self._partial.pop(row["group_id"]), key=lambda r: r["sample_index"])


@dataclass(frozen=True)
class Spool:
    paths: SpoolPaths
    config: RunConfig

    @classmethod
    def create(cls, root: str | Path, **settings: Any) -> "Spool":
        """Create (or reopen) a run directory; settings as dotted keys, e.g. {"pools.run": 16}."""
        paths, config = init_run(root, settings or None)
        return cls(paths, config)

    @classmethod
    def open(cls, root: str | Path) -> "Spool":
        paths, config = open_run(root)
        return cls(paths, config)

    def submit(self, tasks: Iterable[dict[str, Any]], handler: str | None = None, samples: int = 1,
               sampling: dict[str, Any] | None = None, strict: bool = False,
               sampling_unchecked: bool = False) -> SubmitReport:
        """Queue tasks (row shapes as for `hpc-rollout submit`); bad rows are in the report."""
        return submit_rows(self.paths, enumerate(tasks, 1), "<api>", handler, samples, sampling, strict,
                           sampling_unchecked)

    def submit_file(self, path: str | Path, **options: Any) -> SubmitReport:
        return submit_file(self.paths, Path(path), **options)

    def cancel(self, job_ids: Iterable[str] = (), groups: Iterable[str] = (), everything: bool = False) -> list[str]:
        return request_cancel(self.paths, tuple(job_ids), tuple(groups), everything)

    def reader(self, cursor: str | None = None) -> RowReader:
        return RowReader(self.paths, cursor)

    def status(self) -> Snapshot:
        return snapshot(self.paths, self.config)
