"""Queue finished jobs again: `hpc-rollout retry RUN --failed | --cancelled | JOB...`.

The retried jobs are rebuilt from their rows (handler, instance, sampling, data source,
staleness: everything a job was submitted with is in its row) and queued as a new submission,
so they get fresh ids. Nothing of the earlier attempt is touched: its row stays in its shard,
the trainer's tail delivers each job once, and submissions/R.json maps every new job to the one
it retries (orchestrator/spool/retries.py), which is how `inspect` shows each attempt.

Groups: a trainer reads whole groups, and a group with a failed sample was already delivered
with that sample masked. The retried samples of one group therefore come back as a group of
their own (of their number), which the tail delivers once they are all in; `whole_groups`
retries every sample of such groups instead, as a full group again.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from orchestrator.errors import HpcRolloutError
from orchestrator.report.shard_read import read_shards
from orchestrator.spool import fsops, job_ids
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.retries import RETRIES_KEY, RetryLinks, read_retry_links
from orchestrator.spool.tickets import Ticket
from orchestrator.submission.submit import stage_and_publish

# What a job is rebuilt from, besides what selects it.
SPEC_COLUMNS = ("job_id", "group_id", "instance_id", "sample_index", "group_size", "handler", "data_source",
                "status", "instance", "sampling", "staleness")
RETRYABLE = ("failed", "timeout", "cancelled", "ok")


class RetryError(HpcRolloutError, ValueError):
    """Nothing can be retried as asked (names the jobs and why)."""


@dataclass(frozen=True)
class RetryChoice:
    statuses: frozenset[str] = frozenset()   # every finished job whose row has one of these
    jobs: tuple[str, ...] = ()               # and these, whatever their status
    whole_groups: bool = False


@dataclass
class RetryReport:
    submission_id: str
    retries: dict[str, str] = field(default_factory=dict)        # new job id -> the job it retries
    already: dict[str, str] = field(default_factory=dict)        # skipped: job -> the retry that took it
    groups: int = 0
    batches: int = 0
    skipped_shards: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        new = list(self.retries)
        return {
            "submission_id": self.submission_id, "source": "hpc-rollout retry", "tasks": self.groups,
            "jobs": len(new), "batches": self.batches, "first_job": new[0] if new else "",
            "last_job": new[-1] if new else "", "rejected": [], RETRIES_KEY: self.retries,
            **({"already_retried": self.already} if self.already else {}),
        }


def retry_jobs(paths: SpoolPaths, choice: RetryChoice, batch_size: int = 1) -> RetryReport:
    """Queue the jobs `choice` selects again; raise RetryError when it selects none."""
    unknown = sorted(choice.statuses - set(RETRYABLE))
    if unknown:
        raise RetryError(f"cannot select status {unknown}: a finished row's status is one of {', '.join(RETRYABLE)}")
    data = read_shards(paths, SPEC_COLUMNS)
    rows = _latest_rows(data.rows)
    links = read_retry_links(paths)
    report = RetryReport(job_ids.new_submission_id(), skipped_shards=data.skipped)
    chosen = _select(rows, choice, links, report)
    if choice.whole_groups:
        chosen = _whole_groups(rows, chosen)
    if not chosen:
        raise RetryError(_nothing_chosen(choice, report))
    tickets = list(_tickets(report, chosen))
    _names, report.batches = stage_and_publish(paths, report.submission_id, tickets, batch_size)
    fsops.write_atomic(paths.submissions / f"{report.submission_id}.json",
                       orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2), paths.tmp, fsops.Durability.FULL)
    return report


def _latest_rows(table: pa.Table) -> dict[str, dict[str, Any]]:
    """One row per job id, in shard order (a row committed twice by a recovery counts once)."""
    rows: dict[str, dict[str, Any]] = {}
    for row in table.to_pylist():
        rows.setdefault(row["job_id"], row)
    return rows


def _select(rows: dict[str, dict[str, Any]], choice: RetryChoice, links: RetryLinks,
            report: RetryReport) -> list[dict[str, Any]]:
    missing = [job for job in choice.jobs if job not in rows]
    if missing:
        raise RetryError(f"no finished row for {_listed(missing)}: retry takes finished jobs; "
                         "`hpc-rollout inspect RUN JOB` says where a job is (queued or running jobs are still on their way)")
    chosen = [rows[job] for job in dict.fromkeys(choice.jobs)]
    named = set(choice.jobs)
    for job, row in rows.items():
        if row["status"] not in choice.statuses or job in named:
            continue
        if job in links.retried_as:   # its retry is the job to look at now (it has its own row, or is on its way)
            report.already[job] = links.retried_as[job]
            continue
        chosen.append(row)
    return chosen


def _whole_groups(rows: dict[str, dict[str, Any]], chosen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every sample of the chosen rows' groups, whatever each ended as: the samples of a group share
    their task, so this samples the task as many times again (a sample not finished yet is left out)."""
    groups = {row["group_id"] for row in chosen}
    members = {job: row for job, row in rows.items() if row["group_id"] in groups}
    members.update({row["job_id"]: row for row in chosen})
    return sorted(members.values(), key=lambda row: (row["group_id"], row["sample_index"] or 0))


def _tickets(report: RetryReport, chosen: list[dict[str, Any]]) -> Iterator[Ticket]:
    now = time.time()
    by_group: dict[str, list[dict[str, Any]]] = {}
    for row in chosen:
        by_group.setdefault(row["group_id"] or row["job_id"], []).append(row)
    report.groups = len(by_group)
    for task, members in enumerate(by_group.values()):
        group = job_ids.group_id(report.submission_id, task)
        for sample, row in enumerate(members):
            job = JobSpec(
                job_id=job_ids.job_id(report.submission_id, task, sample), group_id=group,
                instance_id=row["instance_id"] or row["group_id"] or row["job_id"], sample_index=sample,
                handler=row["handler"], instance=_json_object(row["instance"]), sampling=_json_object(row["sampling"]),
                submission_id=report.submission_id, submitted_at=now, data_source=row["data_source"] or row["handler"],
                group_size=len(members), staleness=row["staleness"] or "restart",
            )
            report.retries[job.job_id] = row["job_id"]
            yield Ticket(job=job, stage=Stage.INIT, enqueued_at=now)


def _json_object(text: str | None) -> dict[str, Any]:
    value = orjson.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


def _nothing_chosen(choice: RetryChoice, report: RetryReport) -> str:
    asked = " or ".join(sorted(choice.statuses)) or "the named"
    said = f"no {asked} job to retry"
    if report.already:
        said += (f": {len(report.already)} such job(s) were retried already ({_listed(list(report.already))}); "
                 "their retries are the jobs to look at (`hpc-rollout inspect RUN JOB` shows each attempt)")
    if report.skipped_shards:
        said += f"; {len(report.skipped_shards)} shard(s) could not be read: {report.skipped_shards[0]}"
    return said


def _listed(jobs: Collection[str] | Iterable[str], most: int = 3) -> str:
    items = list(jobs)
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")
