"""Columns of the committed shards, read file by file so one bad shard costs only itself.

Only the columns asked for are decoded (Parquet is columnar: reward and status of 1e5 rows
are a few hundred kilobytes), nested turn fields included (`turns.list.element.backend`).
Shards are listed, opened and decoded by orchestrator/spool/shard_reader.py (the one filter of
committed shard names; other *.parquet files there are named as skipped). A column missing from
an older shard reads as nulls.
"""

from __future__ import annotations

import bisect
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shard_reader import READ_ERRORS, list_shards, open_shard, unreadable_because, validated
from orchestrator.spool.rows import SCHEMA, TURN_TYPE

READ_THREADS = 4
TURN_TYPES = {f.name: f.type for f in TURN_TYPE}
# Derived per-turn column: the length of output_ids, without keeping the ids themselves.
OUTPUT_TOKENS = "output_tokens"


@dataclass(frozen=True)
class ShardData:
    rows: pa.Table              # the requested row columns, one row per finished job
    turns: pa.Table             # "row" (index into rows) + the requested turn fields
    shards_read: int
    skipped: tuple[str, ...]    # "shards/NAME: why", one per shard that could not be read
    files: tuple[Path, ...] = ()        # the shards read, in the order of their rows
    first_rows: tuple[int, ...] = ()    # index of each file's first row in `rows`

    def file_of(self, row: int) -> Path:
        return self.files[bisect.bisect_right(self.first_rows, row) - 1]


def read_shards(paths: SpoolPaths, columns: Sequence[str], turn_fields: Sequence[str] = (),
                since: float | None = None, files: Sequence[Path] | None = None) -> ShardData:
    """`columns` of every row (finished at or after `since`, epoch seconds) and `turn_fields` of
    their turns, from every committed shard or only from `files`."""
    wanted = list(dict.fromkeys([*columns, *(["finished_at"] if since is not None else [])]))
    unknown = [c for c in wanted if SCHEMA.get_field_index(c) < 0]
    unknown += [f for f in turn_fields if f not in TURN_TYPES and f != OUTPUT_TOKENS]
    if unknown:
        raise ValueError(f"unknown shard column(s) {unknown}; valid: {', '.join(SCHEMA.names)}")
    skipped: list[str] = []
    if files is None:
        listing = list_shards(paths)
        files = [paths.shards / name for name in listing.committed]
        skipped += [f"shards/{name}: not named as a shard (WRITER-SEQ.parquet): not read" for name in listing.foreign]
    files = list(files)
    with ThreadPoolExecutor(READ_THREADS) as pool:
        parts = list(pool.map(lambda f: _read_one(f, wanted, tuple(turn_fields), since), files))
    row_tables, turn_tables, read, firsts = [], [], [], []
    base = 0
    for path, part in zip(files, parts):
        if isinstance(part, str):
            skipped.append(f"shards/{path.name}: {part}")
            continue
        rows, turns = part
        if turn_fields:
            turns = turns.set_column(0, "row", pc.add(turns.column("row"), base))
            turn_tables.append(turns)
        row_tables.append(rows)
        read.append(path)
        firsts.append(base)
        base += rows.num_rows
    row_schema = pa.schema([SCHEMA.field(c) for c in wanted])
    turn_schema = _turn_schema(turn_fields)
    return ShardData(
        rows=pa.concat_tables(row_tables) if row_tables else row_schema.empty_table(),
        turns=pa.concat_tables(turn_tables) if turn_tables else turn_schema.empty_table(),
        shards_read=len(row_tables), skipped=tuple(skipped), files=tuple(read), first_rows=tuple(firsts),
    )


def _turn_schema(turn_fields: Sequence[str]) -> pa.Schema:
    fields = [pa.field("row", pa.int64())]
    for name in turn_fields:
        fields.append(pa.field(name, pa.int32() if name == OUTPUT_TOKENS else TURN_TYPES[name]))
    return pa.schema(fields)


def _read_one(path: Path, columns: list[str], turn_fields: tuple[str, ...],
              since: float | None) -> tuple[pa.Table, pa.Table] | str:
    try:
        return _decode(path, columns, turn_fields, since)
    except READ_ERRORS as exc:
        return unreadable_because(exc)


def _decode(path: Path, columns: list[str], turn_fields: tuple[str, ...],
            since: float | None) -> tuple[pa.Table, pa.Table]:
    parquet = open_shard(path)
    present = set(parquet.schema_arrow.names)
    leaves = {parquet.schema.column(i).path for i in range(len(parquet.schema))}
    turn_paths = {name: f"turns.list.element.{'output_ids' if name == OUTPUT_TOKENS else name}" for name in turn_fields}
    selected = [c for c in columns if c in present]
    selected += [p for p in turn_paths.values() if any(leaf.startswith(p) for leaf in leaves)]
    table = validated(parquet.read(columns=list(dict.fromkeys(selected)), use_threads=False))
    n = table.num_rows
    arrays = []
    for name in columns:
        target = SCHEMA.field(name).type
        arrays.append(table.column(name).cast(target) if name in present else pa.nulls(n, target))
    rows = pa.table(arrays, names=columns)
    keep = None
    if since is not None:
        finished = pc.cast(rows.column("finished_at"), pa.int64()).to_numpy(zero_copy_only=False)
        keep = finished >= int(since * 1e6)
        rows = rows.filter(pa.array(keep))
    turns = _turns(table, turn_fields, turn_paths, n, keep) if turn_fields else pa.table({})
    return rows, turns


def _turns(table: pa.Table, turn_fields: tuple[str, ...], turn_paths: dict[str, str], n: int,
           keep: np.ndarray | None) -> pa.Table:
    schema = _turn_schema(turn_fields)
    if "turns" not in table.column_names:
        return schema.empty_table()
    lists = table.column("turns").combine_chunks()
    parents = pc.list_parent_indices(lists).to_numpy()
    flat = pc.list_flatten(lists)
    present = {flat.type.field(i).name for i in range(flat.type.num_fields)}
    columns: list[pa.Array] = [pa.array(parents, pa.int64())]
    for name in turn_fields:
        source = "output_ids" if name == OUTPUT_TOKENS else name
        if source not in present:
            columns.append(pa.nulls(len(flat), schema.field(name).type))
        elif name == OUTPUT_TOKENS:
            columns.append(pc.list_value_length(flat.field(source)).cast(pa.int32()))
        else:
            columns.append(flat.field(source).cast(schema.field(name).type))
    turns = pa.table(columns, schema=schema)
    if keep is not None:
        renumber = np.cumsum(keep) - 1
        kept = keep[parents]
        turns = turns.filter(pa.array(kept)).set_column(0, "row", pa.array(renumber[parents[kept]], pa.int64()))
    return turns
