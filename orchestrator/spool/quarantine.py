"""Poison in, quarantine out: data that cannot be encoded or decoded is moved aside with a reason.

It never crashes a worker twice:
  * a row that cannot be encoded (a token id beyond int32, a value of the wrong type) becomes a
    `failed` row carrying the encoding error; the original is kept in quarantine/ as JSON;
  * a shard that cannot be read (truncated by a crash, overwritten) is moved to quarantine/
    with a note by whoever needs its content (recovery); readers skip it with a warning
    (orchestrator/spool/shard_reader.py).
"""

from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path
from typing import Any

import pyarrow as pa

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rows import SCHEMA, rows_to_table

log = logging.getLogger(__name__)

# What pyarrow (and our own conversions) raise for a value that does not fit its column.
ENCODE_ERRORS: tuple[type[BaseException], ...] = (
    pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError, ValueError,
)
# Columns that describe the job rather than its trajectory: kept in the `failed` row of a poisoned one.
IDENTITY_COLUMNS = (
    "job_id", "group_id", "instance_id", "sample_index", "group_size", "handler", "data_source",
    "init_s", "run_s", "eval_s", "queue_s", "counted_s", "submitted_at", "run_started_at",
    "run_ended_at", "finished_at", "worker", "node", "attempt", "instance", "sampling",
)
MAX_ERROR_CHARS = 2000


def encode_rows(rows: list[dict[str, Any]], paths: SpoolPaths) -> tuple[pa.Table, int]:
    """The rows as one table; rows that cannot be encoded are replaced by `failed` rows.

    Returns (table, number of poisoned rows). The common case costs one conversion; only a
    batch that fails is converted row by row to find the culprits.
    """
    try:
        return rows_to_table(rows), 0
    except ENCODE_ERRORS:
        pass
    clean: list[dict[str, Any]] = []
    poisoned = 0
    for row in rows:
        try:
            rows_to_table([row])
            clean.append(row)
        except ENCODE_ERRORS as exc:
            poisoned += 1
            clean.append(poisoned_row(paths, row, exc))
    return rows_to_table(clean), poisoned


def poisoned_row(paths: SpoolPaths, row: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    """A `failed` row in place of `row`, which is kept as JSON in quarantine/ for the author."""
    job_id = str(row.get("job_id") or "unknown")
    reason = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    kept = keep_aside(paths, f"row-{job_id}.json", json.dumps(row, default=str).encode(),
                      f"the row of job {job_id} cannot be stored in a shard: {reason}")
    log.warning("job %s: its row cannot be stored (%s); failed row written, original in %s", job_id, reason, kept)
    failed: dict[str, Any] = {name: None for name in SCHEMA.names}
    for name in IDENTITY_COLUMNS:
        failed[name] = row.get(name)
    failed.update({
        "job_id": job_id, "status": "failed", "error_stage": "commit",
        "error": f"RowEncodingError: the row cannot be stored: {reason} (original kept in {kept})",
    })
    try:
        rows_to_table([failed])
    except ENCODE_ERRORS:  # even the job's own fields are bad: keep only what cannot be
        failed = {name: failed[name] if name in ("job_id", "status", "error_stage", "error") else None
                  for name in SCHEMA.names}
    return failed


def keep_aside(paths: SpoolPaths, name: str, data: bytes, reason: str) -> Path:
    """Write `data` into quarantine/ under a unique name, with a `.reason` note next to it."""
    fsops.ensure_dir(paths.quarantine)
    target = paths.quarantine / f"{name}.{secrets.token_hex(3)}"
    fsops.write_new(target, data)
    fsops.write_new(target.with_name(target.name + ".reason"), (reason + "\n").encode())
    return target


def quarantine_shard(paths: SpoolPaths, name: str, problem: str) -> Path | None:
    """Move an unreadable shard out of shards/ (None when it is already gone)."""
    try:
        target = fsops.quarantine(paths.shards / name, paths.quarantine,
                                  f"shard {name} is unreadable and was moved out of shards/: {problem}")
    except FileNotFoundError:
        return None
    log.warning("shard %s is unreadable (%s): moved to %s", name, problem, target)
    return target

