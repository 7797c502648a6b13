"""Reading finished trajectories as they land: rows or whole groups, with a lossless cursor.

    reader = spool.reader(saved_cursor)            # None: from the first shard of every writer
    for group in reader.groups(follow=True):       # only complete groups
        train_on(group)
        save(str(reader.cursor))                   # with the model: resume loses and repeats nothing

The reader follows each writer's shard sequence (orchestrator/spool/shard_follower.py), never
the clock: about two stats per open writer a poll, however many shards exist. Rows are fetched a
shard at a time and *held* until delivered; the cursor records held rows as ranges, so a crash in the
middle of a shard or of a group resumes exactly where the trainer stopped.

Rows are dicts; list columns of numbers (prompt_ids, response_ids, response_mask, logprobs)
are numpy arrays (views of the decoded shard, no copy per token): `.tolist()` gives lists.

Columnar, for trainers that want speed: `reader.batches()` yields each shard's rows as one
`pyarrow.RecordBatch` (no dict per row; several times the rows per second of `rows()`), with
the same cursor: after a batch is handed out, `reader.cursor` covers exactly its rows.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from orchestrator.spool import fsops
from orchestrator.trainer.cursor import Cursor, RowKey
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shard_follower import ShardFollower

log = logging.getLogger(__name__)

Row = dict[str, Any]
# Columns a group needs whatever the caller asks for.
GROUP_COLUMNS = ("job_id", "group_id", "group_size", "sample_index")
# The columns a trainer needs for batches (everything but the bulky per-turn records and JSON).
TRAINER_COLUMNS = (
    *GROUP_COLUMNS, "instance_id", "handler", "data_source", "status", "reward", "prompt_ids",
    "response_ids", "response_mask", "logprobs", "policy_version_min", "policy_version_max",
    "error", "worker", "logprob_mode", "staleness", "turn_spans", "turn_rewards",
)
# A poll stops fetching after this many rows (more come with the next poll): bounded memory.
MAX_FETCH_ROWS = 20_000


@dataclass
class RowReader:
    """Rows of committed shards, writer by writer in sequence order; see the module doc."""

    paths: SpoolPaths
    cursor_in: Cursor | str | None = None
    poll_s: float = 0.2
    columns: Sequence[str] | None = None   # None: every column
    _held: dict[RowKey, Row] = field(default_factory=dict, init=False)   # insertion order = fetch order
    _held_jobs: set[Any] = field(default_factory=set, init=False)
    _order: deque[RowKey] = field(default_factory=deque, init=False)   # held keys, fetch order
    _grouping: bool = field(default=False, init=False)   # rows are indexed by group once groups are asked for
    _groups: dict[str, list[RowKey]] = field(default_factory=dict, init=False)
    _ready: deque[str] = field(default_factory=deque, init=False)
    _ready_set: set[str] = field(default_factory=set, init=False)   # _ready minus groups taken apart by rows()
    duplicates: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        start = Cursor.parse(self.cursor_in)
        columns = None if self.columns is None else list(dict.fromkeys((*GROUP_COLUMNS, *self.columns)))
        self.shards = ShardFollower(self.paths, columns, dict(start.next_seq))
        self._refetch(start.held_keys())

    @property
    def skipped_shards(self) -> list[str]:
        """Shards skipped (missing or unreadable), by name, in the order met."""
        return self.shards.skipped

    def close(self) -> None:
        """Stop decoding ahead and end the read-ahead thread; the cursor stays valid."""
        self.shards.close()

    def __enter__(self) -> "RowReader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the cursor ---------------------------------------------------------------------------
    @property
    def cursor(self) -> Cursor:
        """What has been delivered so far; pass it (or str() of it) to a new reader to resume."""
        return Cursor.of(self.shards.next_seq, self._held.keys())

    @property
    def held(self) -> int:
        """Rows fetched but not delivered yet (incomplete groups, the rest of a shard)."""
        return len(self._held)

    # -- delivery -----------------------------------------------------------------------------
    def batches(self, follow: bool = False) -> Iterator[pa.RecordBatch]:
        """Every row once, a shard per batch (columnar); with follow, wait for new shards forever.

        Rows already held (a resumed cursor's, or fetched by rows()/groups()/poll()) come first,
        as one batch. The cursor read after a batch covers exactly the rows handed out so far:
        persist it with what the batch was used for. Writers take turns, a shard each.
        """
        while True:
            if self._held:
                yield self._take_held_batch()
                continue
            delivered = 0
            for writer in self.shards.writers_to_probe():
                batch = self._fetch_batch(writer)
                if batch is not None:
                    delivered += 1
                    yield batch
            if delivered == 0:
                if not follow:
                    return
                self.wait(self.poll_s)

    def rows(self, follow: bool = False) -> Iterator[Row]:
        """Every row once, oldest fetched first. With follow, wait for new shards forever."""
        while True:
            while self._order:
                key = self._order.popleft()
                row = self._held.pop(key, None)
                if row is not None:   # else: delivered with its group already
                    self._held_jobs.discard(row["job_id"])
                    if self._grouping:
                        self._unindex(key, row)
                    yield row
            if self.poll() == 0:
                if not follow:
                    return
                self.wait(self.poll_s)

    def groups(self, follow: bool = False) -> Iterator[list[Row]]:
        """Whole groups only, each once, when every sample of the group has its row."""
        while True:
            group = self.take_group()
            if group is not None:
                yield group
                continue
            if self.poll() == 0:
                if not follow:
                    return
                self.wait(self.poll_s)

    def take_group(self) -> list[Row] | None:
        """A complete group already fetched (marked delivered), or None."""
        if not self._grouping:
            self._start_grouping()
        while self._ready and self._ready[0] not in self._ready_set:
            self._ready.popleft()
        if not self._ready:
            return None
        group_id = self._ready.popleft()
        self._ready_set.discard(group_id)
        keys = self._groups.pop(group_id)
        rows = [self._held.pop(key) for key in keys]
        self._held_jobs.difference_update(r["job_id"] for r in rows)
        return sorted(rows, key=lambda r: r.get("sample_index") or 0)

    def wait(self, timeout_s: float) -> None:
        """Sleep until a shard is committed on this node, or `timeout_s` at most."""
        self.shards.wait_for_commit(timeout_s)

    def next_group(self, timeout_s: float) -> list[Row] | None:
        """The next complete group, polling for up to `timeout_s`; None when none came."""
        deadline = time.monotonic() + timeout_s
        while True:
            group = self.take_group()
            if group is not None:
                return group
            if self.poll() > 0:
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.wait(min(self.poll_s, left))

    # -- fetching -------------------------------------------------------------------------------
    def poll(self) -> int:
        """Fetch every shard committed since the last poll; the number of rows fetched."""
        fetched = 0
        fsops.refresh_dir(self.paths.shards)   # shards another node committed: found by name now (fsops.refresh_dir)
        for writer in self.shards.writers_to_probe():
            fetched += self._follow_writer(writer, MAX_FETCH_ROWS - fetched)
            if fetched >= MAX_FETCH_ROWS:
                break
        return fetched

    def _follow_writer(self, writer: str, budget: int) -> int:
        """Hold the writer's next shards' rows, up to about `budget` rows; how many were held."""
        fetched = 0
        while fetched < budget and (taken := self.shards.take_next(writer)) is not None:
            seq, table = taken
            rows = table_rows(table)
            self._hold_all(writer, seq, enumerate(rows))
            fetched += len(rows)
        return fetched

    def _fetch_batch(self, writer: str) -> pa.RecordBatch | None:
        """The writer's next shard with rows, as a batch, the cursor moved past it; None: none yet."""
        while (taken := self.shards.take_next(writer)) is not None:
            if taken[1].num_rows:
                return table_batch(taken[1])
        return None

    def _take_held_batch(self) -> pa.RecordBatch:
        """Every held row as one batch, marked delivered."""
        keys = [key for key in self._order if key in self._held]
        self._order.clear()
        rows = [self._held.pop(key) for key in keys]
        self._held_jobs.difference_update(row["job_id"] for row in rows)
        if self._grouping:
            for key, row in zip(keys, rows):
                self._unindex(key, row)
        try:
            return pa.RecordBatch.from_pylist(rows, schema=self.shards.schema)
        except (pa.ArrowException, KeyError, TypeError, ValueError):   # held rows of shards with other schemas
            return pa.RecordBatch.from_pylist(rows)

    def _refetch(self, keys: list[RowKey]) -> None:
        """Rows a previous reader held when its cursor was taken: read them again."""
        by_shard: dict[tuple[str, int], list[int]] = {}
        for writer, seq, index in keys:
            by_shard.setdefault((writer, seq), []).append(index)
        for (writer, seq), indices in by_shard.items():
            table = self.shards.read_table(writer, seq)
            if table is None:
                self.shards.skip(writer, seq, "held by the cursor but missing")
                continue
            rows = table_rows(table)
            self._hold_all(writer, seq, ((i, rows[i]) for i in indices if i < len(rows)))

    # -- groups -------------------------------------------------------------------------------
    def _hold_all(self, writer: str, seq: int, rows: Iterable[tuple[int, Row]]) -> None:
        """Keep fetched rows until delivered (a loop tuned: it runs per row)."""
        held, jobs, order = self._held, self._held_jobs, self._order
        added = []
        for index, row in rows:
            key = (writer, seq, index)
            job = row["job_id"]
            if job in jobs:
                self.duplicates += 1   # a job's row committed twice (recovery): deliver it once
                log.warning("row of job %s seen twice; the second copy is dropped", job)
                continue
            held[key] = row
            jobs.add(job)
            order.append(key)
            added.append(key)
        if self._grouping:
            self._index(added)
        if len(order) > 2 * len(held) + 4096:   # keys of groups delivered meanwhile
            self._order = deque(k for k in order if k in held)

    def _start_grouping(self) -> None:
        self._grouping = True
        self._index([key for key in self._order if key in self._held])

    def _index(self, keys: Iterable[RowKey]) -> None:
        held, groups = self._held, self._groups
        for key in keys:
            row = held[key]
            group_id = row["group_id"] or row["job_id"]
            members = groups.get(group_id)
            if members is None:
                members = groups[group_id] = [key]
            else:
                members.append(key)
            if len(members) >= (row["group_size"] or 1):
                self._ready.append(group_id)
                self._ready_set.add(group_id)

    def _unindex(self, key: RowKey, row: Row) -> None:
        """A row delivered on its own (rows()): it leaves its group's index."""
        group_id = row["group_id"] or row["job_id"]
        members = self._groups.get(group_id)
        if members is None:
            return
        members.remove(key)
        if not members:
            del self._groups[group_id]
            self._ready_set.discard(group_id)


def table_batch(table: pa.Table) -> pa.RecordBatch:
    """A shard's table as one record batch (a copy only when it has several row groups)."""
    batches = table.to_batches() if table.num_rows else []
    if len(batches) == 1:
        return batches[0]
    return table.combine_chunks().to_batches()[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


def table_rows(table: pa.Table | pa.RecordBatch) -> list[Row]:
    """Rows of a shard or batch as dicts; number lists become numpy views (5x faster than to_pylist)."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    names, columns = [], []
    for name in table.column_names:
        chunked = table.column(name)
        column = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
        names.append(name)
        kind = column.type
        if pa.types.is_list(kind) and (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)):
            offsets = column.offsets.to_numpy().tolist()
            values = column.values.to_numpy(zero_copy_only=False)
            parts: list[Any] = [values[start:end] for start, end in zip(offsets[:-1], offsets[1:])]
            if column.null_count:
                parts = [part if valid else None for part, valid in zip(parts, column.is_valid().to_pylist())]
            columns.append(parts)
        else:
            columns.append(column.to_pylist())
    return [dict(zip(names, values)) for values in zip(*columns)] if columns else []
