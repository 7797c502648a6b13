"""Which job retried which: read from the records `hpc-rollout retry` writes in submissions/.

A retry is a submission of its own (submissions/R.json, with `"retries": {NEW_JOB: EARLIER_JOB}`),
so the jobs it queues get fresh ids: an earlier job's row, its cancel request and the tail's
"one row per job" all stay true, and `cat submissions/R.json` says where each job came from.
A job retried twice forms a chain: EARLIER <- RETRY 1 <- RETRY 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths

RETRIES_KEY = "retries"


@dataclass(frozen=True)
class RetryLinks:
    earlier_of: dict[str, str] = field(default_factory=dict)   # a retry's job id -> the job it retried
    retried_as: dict[str, str] = field(default_factory=dict)   # a job id -> the (latest) retry of it

    def chain(self, job_id: str) -> list[str]:
        """Every attempt of the job `job_id` belongs to, first submission first."""
        first = job_id
        seen = {first}
        while (earlier := self.earlier_of.get(first)) is not None and earlier not in seen:
            first = earlier
            seen.add(first)
        chain = [first]
        while (later := self.retried_as.get(chain[-1])) is not None and later not in chain:
            chain.append(later)
        return chain


def read_retry_links(paths: SpoolPaths) -> RetryLinks:
    """The links of every retry record; a record that cannot be read links nothing (it is named
    by `status`, which reads the same directory)."""
    earlier_of: dict[str, str] = {}
    retried_as: dict[str, str] = {}
    for name in sorted(fsops.list_names(paths.submissions)):   # oldest first: a later retry wins
        if not name.endswith(".json"):
            continue
        try:
            record = orjson.loads(fsops.read_bytes(paths.submissions / name))
        except (OSError, orjson.JSONDecodeError):
            continue
        links = record.get(RETRIES_KEY) if isinstance(record, dict) else None
        if not isinstance(links, dict):
            continue
        for new, old in links.items():
            if isinstance(new, str) and isinstance(old, str):
                earlier_of[new] = old
                retried_as[old] = new
    return RetryLinks(earlier_of, retried_as)
