"""Job and group ids: the one place their format is written and read.

    submission   20260514T093012345-a3f9          UTC time to the millisecond, a random suffix
    group        <submission>-<task:07d>          one task of the submission (its samples' group)
    job          <group>-<sample:04d>             one sample of that task

Ids sort in submission order, so queue entries named by them are claimed oldest first; a
batch of consecutive jobs is judged by name alone (which tasks it can hold), and `cancel --all`
compares the submission time at the head of an id without opening anything.
"""

from __future__ import annotations

import calendar
import re
import secrets
import time
from dataclasses import dataclass

TASK_DIGITS = 7
SAMPLE_DIGITS = 4
_STAMP = "%Y%m%dT%H%M%S"   # + 3 digits of milliseconds
_STAMP_CHARS = 15
_GROUP = re.compile(rf"^(?P<submission>.+)-(?P<task>\d{{{TASK_DIGITS}}})$")
_JOB = re.compile(rf"^(?P<group>(?P<submission>.+)-(?P<task>\d{{{TASK_DIGITS}}}))-(?P<sample>\d{{{SAMPLE_DIGITS}}})$")

_last_submission_ms = 0


@dataclass(frozen=True)
class GroupId:
    submission: str
    task: int

    def __str__(self) -> str:
        return f"{self.submission}-{self.task:0{TASK_DIGITS}d}"


@dataclass(frozen=True)
class JobId:
    submission: str
    task: int
    sample: int

    @property
    def group(self) -> GroupId:
        return GroupId(self.submission, self.task)

    def __str__(self) -> str:
        return f"{self.group}-{self.sample:0{SAMPLE_DIGITS}d}"


def new_submission_id() -> str:
    """Sortable by submission time (to the millisecond), unique by its random suffix.

    Within one process the millisecond never repeats: two submissions in the same
    millisecond would otherwise sort by their random suffixes, not in the order made.
    """
    global _last_submission_ms
    ms = max(int(time.time() * 1000), _last_submission_ms + 1)
    _last_submission_ms = ms
    stamp = time.strftime(_STAMP, time.gmtime(ms / 1000))
    return f"{stamp}{ms % 1000:03d}-{secrets.token_hex(2)}"


def group_id(submission: str, task: int) -> str:
    return str(GroupId(submission, task))


def job_id(submission: str, task: int, sample: int) -> str:
    return str(JobId(submission, task, sample))


def parse_group_id(text: str) -> GroupId | None:
    match = _GROUP.match(text)
    return GroupId(match.group("submission"), int(match.group("task"))) if match else None


def parse_job_id(text: str) -> JobId | None:
    match = _JOB.match(text)
    return JobId(match.group("submission"), int(match.group("task")), int(match.group("sample"))) if match else None


def group_of(job: str) -> str | None:
    """The group id of a job id, None when `job` is not one."""
    match = _JOB.match(job)
    return match.group("group") if match else None


def submitted_at(any_id: str) -> float:
    """The submission time (epoch seconds) at the head of a submission, group or job id; +inf
    when there is none (such an id is never older than a time)."""
    head = any_id.split("-", 1)[0]
    try:
        seconds = calendar.timegm(time.strptime(head[:_STAMP_CHARS], _STAMP))
        return seconds + int(head[_STAMP_CHARS:_STAMP_CHARS + 3]) / 1000
    except (ValueError, IndexError):
        return float("inf")
