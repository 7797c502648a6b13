"""Cancellation requests: files under cancel/ that every worker polls.

    cancel/JOB        cancel one job
    cancel/group-G    cancel every sample of group G
    cancel/ALL        cancel every job submitted before the time written in it
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.batches import first_job_of, is_batch, may_hold_job, may_hold_task
from orchestrator.spool.job_ids import GroupId, JobId, group_of, parse_group_id, parse_job_id, submitted_at
from orchestrator.spool.jobs import JobSpec
from orchestrator.spool.paths import SpoolPaths, safe_name

ALL = "ALL"
GROUP_PREFIX = "group-"


def request_cancel(
    paths: SpoolPaths, job_ids: tuple[str, ...] = (), groups: tuple[str, ...] = (), everything: bool = False,
    check: bool = True,
) -> list[str]:
    """Write cancellation requests; return the request file names written.

    With `check`, every job and group must belong to a submission of this run (ValueError
    otherwise): a typo would otherwise be accepted and cancel nothing.
    """
    if check:
        for job_id in job_ids:
            _check_known(paths, job_id, parse_job_id, "job")
        for group in groups:
            _check_known(paths, group, parse_group_id, "group")
    fsops.ensure_dir(paths.cancel)
    written = []
    for job_id in job_ids:
        name = safe_name(job_id, "job id")
        fsops.create_exclusive(paths.cancel / name, durability=fsops.Durability.FULL)
        written.append(name)
    for group in groups:
        name = GROUP_PREFIX + safe_name(group, "group id")
        fsops.create_exclusive(paths.cancel / name, durability=fsops.Durability.FULL)
        written.append(name)
    if everything:
        fsops.write_atomic(paths.cancel / ALL, f"{time.time():.6f}\n".encode(), paths.tmp, fsops.Durability.FULL)
        written.append(ALL)
    return written


def _check_known(paths: SpoolPaths, name: str, parse: Callable[[str], JobId | GroupId | None], what: str) -> None:
    if name == ALL:
        raise ValueError(f"'{ALL}' is not a {what} id: to cancel every job submitted so far use --all")
    parsed = parse(name)
    record = _submission(paths, parsed.submission) if parsed else None
    if parsed is not None and record is not None:
        tasks = int(record.get("tasks") or 0)
        samples = int(record.get("jobs") or 0) // tasks if tasks else 0
        if parsed.task < tasks and (not isinstance(parsed, JobId) or parsed.sample < samples):
            return
    example = "SUBMISSION-TASK-SAMPLE" if what == "job" else "SUBMISSION-TASK"
    raise ValueError(f"no {what} {name!r} in {paths.root}: {what} ids look like {example} (see `hpc-rollout "
                     f"status {paths.root}`, or first_job..last_job in {paths.submissions}/*.json)")


def _submission(paths: SpoolPaths, submission_id: str) -> dict[str, Any] | None:
    try:
        record = orjson.loads(fsops.read_bytes(paths.submissions / f"{safe_name(submission_id, 'submission id')}.json"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_requests(paths: SpoolPaths) -> tuple[list[str], float]:
    """The request names in cancel/ and the time in cancel/ALL (0: none): one listing, a read if ALL."""
    names = fsops.list_names(paths.cancel)
    all_before = 0.0
    if ALL in names:
        try:
            all_before = float(fsops.read_bytes(paths.cancel / ALL) or 0)
        except (OSError, ValueError):
            all_before = time.time()
    return names, all_before


@dataclass
class CancelWatch:
    """A worker's view of cancel/, refreshed by listing the directory (one op per refresh)."""

    paths: SpoolPaths
    jobs: set[str] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    all_before: float = 0.0

    def refresh(self) -> None:
        self.apply(*read_requests(self.paths))

    def apply(self, names: Iterable[str], all_before: float) -> None:
        """Take the requests as listed (by this worker, or by the cluster summary's rebuilder)."""
        jobs, groups = set(), set()
        for name in names:
            if name.startswith(GROUP_PREFIX):
                groups.add(name[len(GROUP_PREFIX):])
            elif name != ALL:
                jobs.add(name)
        self.jobs, self.groups, self.all_before = jobs, groups, all_before

    def signature(self) -> tuple[int, int, float]:
        return (len(self.jobs), len(self.groups), self.all_before)

    def matches_name(self, name: str) -> bool:
        """Whether a queue entry may hold a cancelled job, judged from its name alone (no read).

        A single ticket is named by its job: exact. A batch (orchestrator/spool/batches.py) matches when
        one of its jobs may be cancelled: a false positive costs the sweeper a claim, never a miss.
        """
        if not is_batch(name):
            if name in self.jobs or group_of(name) in self.groups:
                return True
            return self.all_before > 0 and submitted_at(name) <= self.all_before
        if self.all_before > 0 and submitted_at(first_job_of(name)) <= self.all_before:
            return True
        if any(may_hold_job(name, job_id) for job_id in self.jobs):
            return True
        for group in self.groups:
            parts = parse_group_id(group)
            if parts is not None and may_hold_task(name, parts.submission, parts.task):
                return True
        return False

    def is_cancelled(self, job: JobSpec) -> bool:
        return (
            job.job_id in self.jobs
            or job.group_id in self.groups
            or (self.all_before > 0 and job.submitted_at <= self.all_before)
        )
