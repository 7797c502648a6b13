"""Everything known about one job: input, where it is, timeline, outputs, errors, log paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from orchestrator.errors import HpcRolloutError
from orchestrator.spool import fsops
from orchestrator.spool.batches import decode_batch, is_batch, jobs_in, may_hold_job
from orchestrator.spool.events import events_of
from orchestrator.spool.paths import SpoolPaths, safe_name
from orchestrator.spool.retries import read_retry_links
from orchestrator.spool.shard_reader import READ_ERRORS, read_shard_table, shard_names, unreadable_because, warn_skipped
from orchestrator.spool.journal import read as read_journal, resume_journaled
from orchestrator.spool.tickets import CorruptTicket, Ticket


# What `inspect` shows of each attempt of a retried job.
ATTEMPT_FIELDS = ("status", "reward", "error", "worker", "attempt", "finished_at")


class JobNotFound(HpcRolloutError, LookupError):
    """No ticket, row or event mentions the job id."""


def locate_ticket(paths: SpoolPaths, job_id: str) -> Path | None:
    candidates = [paths.init_queue / job_id, paths.eval_queue / job_id]
    candidates += [queue / job_id for queue in paths.run_queues()]
    candidates += [claims / job_id for claims in _claim_dirs(paths)]
    return next((c for c in candidates if c.exists()), None)


def _claim_dirs(paths: SpoolPaths) -> list[Path]:
    return [claims for claims in paths.active.iterdir() if claims.is_dir()] if paths.active.is_dir() else []


def locate_in_batch(paths: SpoolPaths, job_id: str) -> tuple[Path, Ticket | CorruptTicket] | None:
    """The batch file (queued or claimed) holding `job_id`, with its ticket (or why it cannot be read).

    Only batches whose name says they may hold the job are opened (orchestrator/spool/batches.py).
    """
    for directory in [paths.init_queue, *_claim_dirs(paths)]:
        for name in sorted(fsops.list_names(directory)):
            if not is_batch(name) or not may_hold_job(name, job_id):
                continue
            try:
                tickets = decode_batch(fsops.read_bytes(directory / name), name)
            except OSError:
                continue   # claimed or finished meanwhile
            except CorruptTicket as exc:   # its name says it may hold the job: say why it cannot tell
                return directory / name, exc
            found = next((t for t in tickets if t.name == job_id), None)
            if found is not None:
                return directory / name, found
    return None


def find_row(paths: SpoolPaths, job_id: str) -> dict[str, Any] | None:
    names = shard_names(paths)
    if not names:
        return None
    found = None
    for name in names:   # the job id column first: a shard is read whole only when it holds the job
        try:
            path = paths.shards / name
            if job_id not in read_shard_table(path, ["job_id"]).column(0).to_pylist():
                continue
            rows = [row for row in read_shard_table(path).to_pylist() if row["job_id"] == job_id]
        except READ_ERRORS as exc:   # an unreadable shard: look through the readable ones only
            warn_skipped(name, unreadable_because(exc))
            continue
        found = rows[-1] if rows else found
    return found


def _worker_logs(paths: SpoolPaths, worker_ids: set[str]) -> list[str]:
    logs = []
    for worker_id in sorted(worker_ids):
        for heartbeat in (paths.heartbeat(worker_id), paths.workers / "gone" / f"{worker_id}.json"):
            if heartbeat.exists():
                info = orjson.loads(fsops.read_bytes(heartbeat))
                launch = info.get("launch_id")
                if launch and (paths.logs / launch).is_dir():
                    logs.append(f"{paths.logs / launch} (worker {worker_id}, pid {info.get('pid')})")
                break
    return logs


_LOOK_UP = object()


def inspect_job(paths: SpoolPaths, job_id: str, *, row: Any = _LOOK_UP, events: Any = _LOOK_UP) -> dict[str, Any]:
    """Everything known about `job_id`; a caller that already read its row or events passes them."""
    safe_name(job_id, "job id")
    report: dict[str, Any] = {"job_id": job_id}
    location = locate_ticket(paths, job_id)
    ticket: Ticket | None = None
    if location is not None:
        report["where"] = str(location.relative_to(paths.root))
        try:
            ticket = Ticket.decode(fsops.read_bytes(location, fsops.TICKET_READ_LIMIT))
        except (CorruptTicket, OSError) as exc:
            report["ticket_error"] = str(exc)
        if ticket is not None and location.parent.parent == paths.active:   # claimed: its worker's
            report["journaled"] = resume_journaled(ticket, read_journal(location.parent).get(job_id))  # journal may say more
    elif (in_batch := locate_in_batch(paths, job_id)) is not None:
        report["where"] = f"{in_batch[0].relative_to(paths.root)} (a batch of {jobs_in(in_batch[0].name)} jobs)"
        if isinstance(in_batch[1], CorruptTicket):
            report["ticket_error"] = str(in_batch[1])
        else:
            ticket = in_batch[1]
            if in_batch[0].parent.parent == paths.active:   # claimed: its worker's journal may say more
                report["journaled"] = resume_journaled(ticket, read_journal(in_batch[0].parent).get(job_id))
    if row is _LOOK_UP:
        row = find_row(paths, job_id)
    if events is _LOOK_UP:
        events = events_of(paths, job_id)
    if ticket is None and row is None and not events:
        raise JobNotFound(f"no job {job_id!r} in {paths.root}: `hpc-rollout status {paths.root}` lists the latest "
                          f"submissions' job ranges, `hpc-rollout tail {paths.root} --fields job_id,status` the finished jobs")
    if ticket is not None:
        report.update({
            "handler": ticket.job.handler, "group_id": ticket.job.group_id, "sample_index": ticket.job.sample_index,
            "instance": ticket.job.instance, "sampling": ticket.job.sampling, "stage": ticket.stage.value,
            "attempt": ticket.attempt, "outputs": ticket.outputs, "timings": ticket.timings, "error": ticket.error,
            "history": ticket.history,
        })
    if row is not None:
        report["where"] = report.get("where", "shards (finished)")
        report["row"] = {k: v for k, v in row.items() if k not in ("instance", "sampling", "result")}
        for key in ("instance", "sampling", "result"):
            if row.get(key):
                report.setdefault(key if key != "result" else "outputs", orjson.loads(row[key]))
        report.setdefault("handler", row["handler"])
        report.setdefault("error", row.get("error"))
    report["timeline"] = [e for e in events if e.get("event") != "stage_failed"]
    failures = [e for e in events if e.get("event") == "stage_failed"]
    if failures:  # the handler's traceback, for its author
        report["traceback"] = failures[-1].get("traceback", "")
    report["artifacts"] = str(paths.job_dir(job_id)) if paths.job_dir(job_id).is_dir() else None
    report["logs"] = _worker_logs(paths, {e["worker"] for e in events if "worker" in e})
    attempts = attempts_of(paths, job_id, row)
    if len(attempts) > 1:
        report["attempts"] = attempts
    return report


def attempts_of(paths: SpoolPaths, job_id: str, row: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every attempt of the job, first submission first, as `hpc-rollout retry` linked them: each
    job's id and how its row ended (no "status": not finished yet)."""
    chain = read_retry_links(paths).chain(job_id)
    attempts = []
    for job in chain:
        found = row if job == job_id else find_row(paths, job)
        attempt: dict[str, Any] = {"job_id": job}
        if found is not None:
            attempt.update({key: found.get(key) for key in ATTEMPT_FIELDS})
        attempts.append(attempt)
    return attempts
