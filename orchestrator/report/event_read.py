"""Job events of every worker (events/W.jsonl) as one columnar table, streamed file by file.

Each file is parsed by Arrow's JSON reader (C++, no Python object per line); a file holding a
line cut by a crash or a field of an unexpected type is parsed again line by line, skipping
only what cannot be read, and the count of skipped lines is reported.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Collection

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths

# The fields reports use; other fields of an event are ignored.
EVENT_SCHEMA = pa.schema([
    ("t", pa.float64()), ("job", pa.string()), ("event", pa.string()), ("worker", pa.string()),
    ("s", pa.float64()), ("status", pa.string()), ("stage", pa.string()), ("to", pa.string()),
    ("backend", pa.string()), ("reason", pa.string()),
])
BLOCK_BYTES = 4 << 20


@dataclass(frozen=True)
class EventData:
    table: pa.Table               # EVENT_SCHEMA, file after file, each in file (= emit) order
    files_read: int
    bad_lines: int                # lines that could not be parsed (cut by a crash, not JSON)
    problems: tuple[str, ...]     # what could not be read, for the report


def event_files(paths: SpoolPaths) -> list[Path]:
    try:
        return sorted(paths.events / e.name for e in os.scandir(paths.events) if e.name.endswith(".jsonl"))
    except FileNotFoundError:
        return []


def read_events(paths: SpoolPaths, names: Collection[str] | None = None) -> EventData:
    """Every event (or only those called one of `names`) of every worker."""
    tables, problems, bad_total = [], [], 0
    files = event_files(paths)
    if not files:
        problems.append(f"no event files in {paths.events}: timelines, queue depths and throughput are empty")
    wanted = pa.array(sorted(names), pa.string()) if names is not None else None
    for path in files:
        try:
            table, bad = _read_file(path)
        except OSError as exc:
            problems.append(f"events/{path.name}: {exc}")
            continue
        if bad:
            problems.append(f"events/{path.name}: {bad} unreadable line(s) skipped")
            bad_total += bad
        if wanted is not None:
            table = table.filter(pc.is_in(table.column("event"), value_set=wanted))
        tables.append(table)
    table = pa.concat_tables(tables) if tables else EVENT_SCHEMA.empty_table()
    return EventData(table, len(tables), bad_total, tuple(problems))


def _read_file(path: Path) -> tuple[pa.Table, int]:
    fd, st = fsops.open_regular(path)   # Arrow would follow a planted link, or wait on a FIFO
    with os.fdopen(fd, "rb") as handle:
        if st.st_size == 0:
            return EVENT_SCHEMA.empty_table(), 0
        try:
            table = pj.read_json(
                handle,
                read_options=pj.ReadOptions(block_size=BLOCK_BYTES, use_threads=True),
                parse_options=pj.ParseOptions(explicit_schema=EVENT_SCHEMA, unexpected_field_behavior="ignore"),
            )
            return table.select(EVENT_SCHEMA.names), 0
        except pa.ArrowInvalid:
            handle.seek(0)
            return _read_lines(handle)


def _read_lines(handle: BinaryIO) -> tuple[pa.Table, int]:
    columns: dict[str, list[Any]] = {name: [] for name in EVENT_SCHEMA.names}
    bad = 0
    for line in handle:
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
            values = [_coerce(record.get(f.name), f.type) for f in EVENT_SCHEMA]
        except (orjson.JSONDecodeError, ValueError, TypeError):
            bad += 1
            continue
        for name, value in zip(EVENT_SCHEMA.names, values):
            columns[name].append(value)
    return pa.table(columns, schema=EVENT_SCHEMA), bad


def _coerce(value: Any, kind: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_floating(kind):
        return float(value)
    return value if isinstance(value, str) else str(value)


def events_of_jobs(paths: SpoolPaths, job_ids: Collection[str]) -> dict[str, list[dict[str, Any]]]:
    """Every event of a few jobs, all fields, in one pass over the event files (for `inspect` pages)."""
    found: dict[str, list[dict[str, Any]]] = {job: [] for job in job_ids}
    if not found:
        return found
    # orjson writes `"job":"ID"` with no space; one regex scan per file finds every line of every job.
    pattern = re.compile(b'"job":"(' + b"|".join(re.escape(j.encode()) for j in sorted(found)) + b')"')
    for path in event_files(paths):
        try:
            data = fsops.read_bytes(path, fsops.TICKET_READ_LIMIT)
        except OSError:
            continue
        for match in pattern.finditer(data):
            start = data.rfind(b"\n", 0, match.start()) + 1
            end = data.find(b"\n", match.end())
            try:
                record = orjson.loads(data[start: end if end >= 0 else len(data)])
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("job") in found:
                found[record["job"]].append(record)
    for records in found.values():
        records.sort(key=lambda r: r.get("t", 0.0))
    return found
