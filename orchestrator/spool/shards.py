"""Parquet trajectory shards: written hidden, renamed into place, read by anyone.

A shard is written as `shards/_tmp-NAME` (pyarrow.dataset skips names starting with `_`),
then renamed to `shards/NAME`: a reader never sees a partial file. NAME is
`<writer>-<seq>.parquet`, a per-writer sequence with no clock in it; readers follow it with
a per-writer cursor (orchestrator/spool/shardlog.py, orchestrator/trainer/tail.py). Shards are
read through orchestrator/spool/shard_reader.py.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.errors import HpcRolloutError
from orchestrator.spool import fsops
from orchestrator.config import Shards
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.quarantine import encode_rows, quarantine_shard
from orchestrator.spool.shard_reader import READ_ERRORS, read_shard_table, shard_names, unreadable_because
from orchestrator.spool.shardlog import WriterDirectory, parse_shard_name, shard_exists, shard_name, writers_of_worker


@dataclass
class ShardWriter:
    """Buffers one worker's rows and commits them as shards rolled by rows, bytes and age."""

    paths: SpoolPaths
    worker_id: str
    limits: Shards
    _rows: list[dict[str, Any]] = field(default_factory=list)
    _tickets: list[str] = field(default_factory=list)
    _bytes: int = 0
    _first_at: float = 0.0
    _last_at: float = 0.0
    _seq: int = 0         # sequence number of the last shard committed
    _writer: str = ""     # claimed at the first commit: the worker id, or <id>+N after a restart
    # Every ticket of shards 1..dropped_through is dropped from the claim directory. Published in
    # the heartbeat, it lets recovery read only the shards after it (see committed_job_ids).
    dropped_through: int = 0
    poisoned: int = 0     # rows replaced by `failed` rows because they could not be encoded

    def add(self, row: dict[str, Any], ticket_name: str) -> None:
        now = time.monotonic()
        if not self._rows:
            self._first_at = now
        self._last_at = now
        self._rows.append(row)
        self._tickets.append(ticket_name)
        self._bytes += _approximate_size(row)

    @property
    def pending(self) -> int:
        return len(self._rows)

    @property
    def tickets(self) -> list[str]:
        """Tickets whose rows wait in the buffer."""
        return list(self._tickets)

    def due(self, idle: bool) -> bool:
        """True when the buffer should be committed now."""
        if not self._rows:
            return False
        now = time.monotonic()
        return (
            len(self._rows) >= self.limits.max_rows
            or self._bytes >= self.limits.max_bytes
            or now - self._first_at >= self.limits.max_age_s
            or (idle and now - self._last_at >= self.limits.idle_flush_s)
        )

    def commit(self, staging: Path | None = None) -> list[str]:
        """Write the buffered rows as one shard; return the names of the tickets it finished.

        On failure the rows stay buffered for the next try.
        """
        batch = self.take()
        if batch is None:
            return []
        try:
            self.write(batch, staging)
        except UnflushedShard:
            raise   # committed: the rows must not be written again
        except BaseException:
            self.put_back(batch)
            raise
        return batch.tickets

    def take(self) -> "ShardBatch | None":
        """Empty the buffer into a batch to write (possibly from another thread)."""
        if not self._rows:
            return None
        batch = ShardBatch(self._rows, self._tickets, self._bytes, self._first_at)
        self._rows, self._tickets, self._bytes = [], [], 0
        return batch

    def put_back(self, batch: "ShardBatch") -> None:
        """A batch that could not be written goes back to the head of the buffer."""
        self._rows[:0], self._tickets[:0] = batch.rows, batch.tickets
        self._bytes += batch.bytes
        self._first_at = batch.first_at  # older than anything added meanwhile

    def write(self, batch: "ShardBatch", staging: Path | None = None) -> str:
        """Write one batch as a shard and return its name.

        `staging` is the worker's claim directory: the shard is written there and renamed into
        shards/, so once recovery has taken the claims over (renamed the directory away), the
        rename fails and nothing is committed for them (FencedOut). None writes in shards/.
        """
        if not self._writer:
            self._writer = WriterDirectory(self.paths).register(self.worker_id)
        seq = self._seq + 1   # taken only once committed: a failed try leaves no gap
        name = shard_name(self._writer, seq)
        tmp = staging / f".shard-{name}" if staging is not None else self.paths.shards / f"_tmp-{name}"
        table, poisoned = encode_rows(batch.rows, self.paths)
        try:
            write_durably(table, tmp)
            fsops.replace(tmp, self.paths.shards / name)
        except FileNotFoundError as exc:
            if staging is not None and not staging.is_dir():
                # Fenced for good: this writer commits nothing more. Close it here, since the
                # reaper may have closed the worker's writers before this one was registered.
                self.close()
                raise FencedOut(f"{staging} was taken over: {len(batch.rows)} row(s) not committed") from exc
            raise
        # Renamed in: the rows are committed, whatever fails from here on.
        self._seq = seq
        self.poisoned += poisoned
        try:
            fsops.sync_dir(self.paths.shards)  # the name is durable before the tickets are dropped
        except OSError as exc:
            raise UnflushedShard(f"shard {name} is committed, but flushing {self.paths.shards} failed: {exc}") from exc
        return name

    def close(self) -> None:
        """No more shards from this writer: readers stop probing it. Commit first."""
        if self._writer:
            WriterDirectory(self.paths).close(self._writer, self._seq)
            self._writer = ""

    @property
    def writer(self) -> str:
        return self._writer

    def progress(self) -> dict[str, Any]:
        """What the heartbeat says about this writer's shards (read by recovery)."""
        return {"writer": self._writer, "dropped_through": self.dropped_through} if self._writer else {}

    @property
    def last_seq(self) -> int:
        """Sequence number of the last shard committed (0: none yet)."""
        return self._seq


@dataclass(frozen=True)
class ShardBatch:
    rows: list[dict[str, Any]]
    tickets: list[str]
    bytes: int
    first_at: float


class UnflushedShard(HpcRolloutError, RuntimeError):
    """The shard was renamed into shards/ (its rows ARE committed) but the directory flush failed:
    its tickets may be dropped only after a flush succeeds. Not an OSError, so that no caller
    mistakes it for a failed write and writes the rows again."""


class FencedOut(HpcRolloutError, RuntimeError):
    """The claims a shard would finish are no longer this worker's: nothing was committed."""


def _approximate_size(row: dict[str, Any]) -> int:
    try:
        return len(orjson.dumps(row, default=str))
    except (TypeError, ValueError):  # e.g. an integer beyond 64 bits: the row is poison anyway
        return len(repr(row))


def write_durably(table: pa.Table, path: Path) -> None:
    """Write `table` as Parquet to the new file `path` and flush it; no partial file is left."""
    fsops.count("create")
    try:
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, fsops.modes().file), "wb") as handle:
            pq.write_table(table, handle, compression="zstd")
            handle.flush()
            fsops.sync_file(handle.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def committed_job_ids(paths: SpoolPaths, worker_id: str, progress: dict[str, Any] | None = None) -> set[str]:
    """Job ids in the shards one worker committed (to avoid writing a row twice on recovery).

    `progress` is the worker's last heartbeat's word on its shards (ShardWriter.progress): when it
    names the worker's only writer, the tickets still claimed can only be in the shards after
    `dropped_through`, found by name (a stat each) -- a few operations however many shards the
    run holds. Otherwise every shard of the worker is read.

    A shard that cannot be read is quarantined: its rows are lost either way, and leaving it
    would stop every later recovery at the same place.
    """
    writers = writers_of_worker(worker_id, WriterDirectory(paths).all_writers())
    names = _shards_after(paths, writers, progress)
    if names is None:
        wanted = set(writers)
        names = [n for n in shard_names(paths) if (parsed := parse_shard_name(n)) and parsed[0] in wanted]
    ids: set[str] = set()
    for name in names:
        try:
            ids.update(read_shard_table(paths.shards / name, ["job_id"]).column(0).to_pylist())
        except READ_ERRORS as exc:
            quarantine_shard(paths, name, unreadable_because(exc))
    return ids


def _shards_after(paths: SpoolPaths, writers: list[str], progress: dict[str, Any] | None) -> list[str] | None:
    """The shards of the one writer after its `dropped_through`, or None when that is not known."""
    if not progress or not writers:
        return [] if not writers else None
    writer, dropped = progress.get("writer"), progress.get("dropped_through")
    if not isinstance(writer, str) or writers != [writer] or not isinstance(dropped, int) or dropped < 0:
        return None
    names, seq = [], dropped + 1
    while shard_exists(paths, writer, seq):
        names.append(shard_name(writer, seq))
        seq += 1
    return names
