"""Batch files: one `queue/init/` entry carrying several consecutive jobs of one submission.

A claim is one rename whatever the entry holds, so a batch of B jobs costs one create at
submit, one claim, one read and one unlink for all B (docs/scale.md). The name says what the
file holds without opening it:

    queue/init/20261123T035425123-ab12-0000003-0000+8

is a batch of 8 jobs whose first is job 20261123T035425123-ab12-0000003-0000; the others follow it
in submission order (job ids sort in submission order). `status` counts queued jobs from the
names alone; the cancel sweep and `inspect` narrow down the batches a job can be in from the
name, then read only those. A single job keeps its plain ticket file named by its job id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import orjson

from orchestrator.config import BOUNDS
from orchestrator.spool import fsops
from orchestrator.spool.job_ids import parse_job_id
from orchestrator.spool.tickets import CorruptTicket, Ticket

BATCH_MARK = "+"
MAX_BATCH_SIZE = int(BOUNDS["jobs.batch_size"][1])
_BATCH_NAME = re.compile(r"^(?P<first>.+)\+(?P<count>[1-9][0-9]*)$")


@dataclass(frozen=True)
class BatchName:
    first_job: str
    count: int

    def __str__(self) -> str:
        return f"{self.first_job}{BATCH_MARK}{self.count}"


def batch_name(first_job: str, count: int) -> str:
    return str(BatchName(first_job, count))


def parse_batch_name(name: str) -> BatchName | None:
    """The batch a queue entry's name describes, or None for a single ticket (named by its job)."""
    match = _BATCH_NAME.match(name)
    if match is None or BATCH_MARK in match.group("first"):
        return None
    return BatchName(match.group("first"), int(match.group("count")))


def is_batch(name: str) -> bool:
    return parse_batch_name(name) is not None


def jobs_in(name: str) -> int:
    """Jobs a queue or claim entry holds, from its name alone (no open)."""
    parsed = parse_batch_name(name)
    return parsed.count if parsed is not None else 1


def count_jobs(names: Iterable[str]) -> int:
    return sum(jobs_in(name) for name in names)


def may_hold_task(name: str, submission: str, task: int) -> bool:
    """Whether the entry `name` can hold a job of task `task` of `submission`, judged by name.

    A batch holds `count` consecutive jobs from its first, and each task has at least one job,
    so its tasks lie within [first task, first task + count - 1]: a false positive costs a read
    (or a claim), never a miss.
    """
    parsed = parse_batch_name(name)
    first = parse_job_id(parsed.first_job if parsed else name)
    if first is None or first.submission != submission:
        return False
    first_task = first.task
    return first_task <= task <= first_task + (parsed.count if parsed else 1) - 1


def may_hold_job(name: str, job_id: str) -> bool:
    """Whether the entry `name` can hold `job_id` (a single ticket: only its own job)."""
    parsed = parse_batch_name(name)
    if parsed is None:
        return name == job_id
    parts = parse_job_id(job_id)
    return parts is not None and job_id >= parsed.first_job and may_hold_task(name, parts.submission, parts.task)


def first_job_of(name: str) -> str:
    """The first job id of an entry (the job itself for a single ticket)."""
    parsed = parse_batch_name(name)
    return parsed.first_job if parsed is not None else name


def encode_batch(tickets: list[Ticket]) -> bytes:
    """The file content: {"tickets": [ticket, ...]} in job order."""
    return b'{"tickets":[' + b",".join(ticket.encode() for ticket in tickets) + b"]}"


def decode_batch(data: bytes, name: str) -> list[Ticket]:
    """The tickets of the batch file `name`; CorruptTicket when the content or its name is wrong."""
    parsed = parse_batch_name(name)
    if parsed is None:
        raise CorruptTicket(f"{name!r} is not a batch name (FIRST_JOB+COUNT)")
    try:
        raw: Any = orjson.loads(data)
        entries = raw["tickets"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise CorruptTicket(f"cannot decode batch {name}: {exc}") from exc
    if not isinstance(entries, list):
        raise CorruptTicket(f"batch {name}: 'tickets' is not a list")
    tickets = [Ticket.from_json(entry) for entry in entries]
    ids = [ticket.name for ticket in tickets]
    if len(ids) != parsed.count or not ids or ids[0] != parsed.first_job or ids != sorted(set(ids)):
        raise CorruptTicket(f"batch file {name!r} holds jobs {ids[:3]}{'...' if len(ids) > 3 else ''} "
                            f"({len(ids)}): its name says {parsed.count} sorted distinct jobs from {parsed.first_job}")
    return tickets


def chunks(tickets: Iterable[Ticket], size: int) -> Iterable[list[Ticket]]:
    """Consecutive tickets in batches of at most `size` (the submission's order), each of one
    resource class: a worker judges an entry's class by its first job (worker/class_claims.py)."""
    batch: list[Ticket] = []
    for ticket in tickets:
        if batch and ticket.job.resource_class != batch[0].job.resource_class:
            yield batch
            batch = []
        batch.append(ticket)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def entry_name(tickets: list[Ticket]) -> str:
    """A lone job keeps its plain ticket name; several are a batch named by the first and count."""
    return tickets[0].name if len(tickets) == 1 else batch_name(tickets[0].name, len(tickets))


def entry_content(tickets: list[Ticket]) -> bytes:
    return tickets[0].encode() if len(tickets) == 1 else encode_batch(tickets)


def read_entry(path: Path) -> list[Ticket]:
    """The tickets of one queue entry, a single ticket or a batch (CorruptTicket when unreadable)."""
    data = fsops.read_bytes(path, fsops.TICKET_READ_LIMIT)
    return decode_batch(data, path.name) if is_batch(path.name) else [Ticket.decode(data, path.name)]


def queued_tickets(queue: Path) -> list[Ticket]:
    """Every ticket waiting in `queue`, batches opened, in job order (reads every entry: not for hot paths)."""
    return sorted((t for name in fsops.list_names(queue) for t in read_entry(queue / name)), key=lambda t: t.name)
