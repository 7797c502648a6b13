"""Job timelines: one append-only JSON Lines file per worker (events/W.jsonl).

One file per worker rather than per job: appending to a file that is already open costs the
metadata server nothing, while a file per job would cost a create per job.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import IO, Any, Iterator

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths

log = logging.getLogger(__name__)

# `status` reads only this much of each worker's event file to count the last minute's work.
RECENT_TAIL_BYTES = 8 << 20


class EventLog:
    """Appends `{"t", "job", "event", ...}` lines to this worker's event file."""

    def __init__(self, paths: SpoolPaths, worker_id: str) -> None:
        self.worker_id = worker_id
        self.dropped = 0
        fsops.count("open")
        self._file: IO[bytes] = os.fdopen(fsops.open_append(paths.worker_events(worker_id)), "ab", buffering=0)

    def emit(self, job_id: str, event: str, fields: dict[str, Any] | None = None) -> None:
        """Append one event; never raises: a timeline is worth less than the work it describes."""
        record = {"t": round(time.time(), 6), "job": job_id, "event": event, "worker": self.worker_id}
        if fields:
            record.update(fields)
        try:
            # One write() per line: concurrent readers see whole lines (O_APPEND, unbuffered).
            self._file.write(orjson.dumps(record, default=str) + b"\n")
        except (OSError, TypeError, ValueError) as exc:  # a full spool, say
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("event log of %s: %d event(s) dropped (%s)", self.worker_id, self.dropped, exc)

    def close(self) -> None:
        self._file.close()


def events_of(paths: SpoolPaths, job_id: str) -> list[dict[str, Any]]:
    """Every recorded event of one job, across all workers, in time order."""
    needle = job_id.encode()
    found: list[dict[str, Any]] = []
    for record in _records(paths.events, needle):
        if record.get("job") == job_id:
            found.append(record)
    return sorted(found, key=lambda r: r.get("t", 0.0))


def events_named(paths: SpoolPaths, name: str) -> list[dict[str, Any]]:
    """Every recorded event called `name` (e.g. "finished"), across all workers, in file order."""
    needle = f'"{name}"'.encode()
    return [record for record in _records(paths.events, needle) if record.get("event") == name]


def recent_events(paths: SpoolPaths, since: float, names: set[str]) -> Iterator[dict[str, Any]]:
    """Events named in `names` newer than `since` (for throughput figures in `status`)."""
    for path in sorted(paths.events.glob("*.jsonl")):
        if path.stat().st_mtime < since:
            continue
        for record in _read_lines(path, None, tail_bytes=RECENT_TAIL_BYTES):
            if record.get("t", 0.0) >= since and record.get("event") in names:
                yield record


def _records(directory: Path, needle: bytes | None) -> Iterator[dict[str, Any]]:
    for path in sorted(directory.glob("*.jsonl")):
        yield from _read_lines(path, needle)


def _read_lines(path: Path, needle: bytes | None, tail_bytes: int = 0) -> Iterator[dict[str, Any]]:
    try:
        fd, _ = fsops.open_regular(path)
    except FileNotFoundError:
        return
    except fsops.UnsafeSpoolFile as exc:   # planted: never followed or waited on
        log.warning("event log skipped: %s", exc)
        return
    with os.fdopen(fd, "rb") as handle:
        if tail_bytes:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - tail_bytes))
            if size > tail_bytes:
                handle.readline()  # skip the line cut by the seek
        for line in handle:
            if needle is not None and needle not in line:
                continue
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a line cut by a crash: skip it, keep the rest
