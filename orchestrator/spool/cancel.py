"""Cancellation requests: files under cancel/ that every worker polls.

    cancel/JOB        cancel one job
    cancel/group-G    cancel every sample of group G
    cancel/ALL        cancel every job of the submissions listed in it

`cancel --all` cancels what was submitted before it, by the spool's own order of events: the
submissions recorded in submissions/ when it runs (a `submit` records its submission before it
returns). Never by clock: a submission id starts with its submitter's time, and a submitter whose
clock runs two minutes slow would otherwise have its next submission cancelled as "older".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.batches import first_job_of, is_batch, may_hold_job, may_hold_task
from orchestrator.spool.job_ids import GroupId, JobId, group_of, parse_group_id, parse_job_id
from orchestrator.spool.jobs import JobSpec
from orchestrator.spool.paths import SpoolPaths, safe_name

ALL = "ALL"
GROUP_PREFIX = "group-"
log = logging.getLogger(__name__)
_warned: set[Any] = set()   # cancel/ directories whose unreadable ALL was already logged


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
        covered = sorted(recorded_submissions(paths))
        fsops.write_atomic(paths.cancel / ALL, orjson.dumps({"submissions": covered}), paths.tmp, fsops.Durability.FULL)
        written.append(ALL)
    return written


def recorded_submissions(paths: SpoolPaths) -> set[str]:
    """The submissions recorded in submissions/ (one listing)."""
    return {name[: -len(".json")] for name in fsops.list_names(paths.submissions) if name.endswith(".json")}


def submission_of(job_id: str) -> str:
    """The submission a job id belongs to ("" when it is not a job id of ours)."""
    parsed = parse_job_id(job_id)
    return parsed.submission if parsed else ""


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


def read_requests(paths: SpoolPaths) -> tuple[list[str], frozenset[str]]:
    """The request names in cancel/ and the submissions cancel/ALL covers: one listing, a read if ALL.

    An ALL that cannot be read (of an older version: a time, or edited by hand) covers nothing:
    "everything so far" cannot be told from it without a clock, and taking everything recorded at
    each read would cancel every later submission too. It is logged; `cancel --all` rewrites it."""
    names = fsops.list_names(paths.cancel)
    covered: frozenset[str] = frozenset()
    if ALL in names:
        try:
            listed = orjson.loads(fsops.read_bytes(paths.cancel / ALL))["submissions"]
            covered = frozenset(str(s) for s in listed)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if paths.cancel not in _warned:
                _warned.add(paths.cancel)
                log.warning("%s cannot be read (%s): it cancels nothing; run `hpc-rollout cancel --all` again",
                            paths.cancel / ALL, exc)
    return names, covered


@dataclass
class CancelWatch:
    """A worker's view of cancel/, refreshed by listing the directory (one op per refresh)."""

    paths: SpoolPaths
    jobs: set[str] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    submissions: frozenset[str] = frozenset()   # every job of these is cancelled (cancel/ALL)

    def refresh(self) -> None:
        self.apply(*read_requests(self.paths))

    def apply(self, names: Iterable[str], submissions: frozenset[str]) -> None:
        """Take the requests as listed (by this worker, or by the cluster summary's rebuilder)."""
        jobs, groups = set(), set()
        for name in names:
            if name.startswith(GROUP_PREFIX):
                groups.add(name[len(GROUP_PREFIX):])
            elif name != ALL:
                jobs.add(name)
        self.jobs, self.groups, self.submissions = jobs, groups, frozenset(submissions)

    @property
    def any(self) -> bool:
        return bool(self.jobs or self.groups or self.submissions)

    def signature(self) -> tuple[int, int, int]:
        return (len(self.jobs), len(self.groups), hash(self.submissions))

    def matches_name(self, name: str) -> bool:
        """Whether a queue entry may hold a cancelled job, judged from its name alone (no read).

        A single ticket is named by its job: exact. A batch (orchestrator/spool/batches.py) matches when
        one of its jobs may be cancelled: a false positive costs the sweeper a claim, never a miss.
        """
        if not is_batch(name):
            if name in self.jobs or group_of(name) in self.groups:
                return True
            return bool(self.submissions) and submission_of(name) in self.submissions
        if self.submissions and submission_of(first_job_of(name)) in self.submissions:
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
            or (bool(self.submissions) and (job.submission_id or submission_of(job.job_id)) in self.submissions)
        )
