"""Replay: the finished trajectories of a run, selected by a query, as whole groups.

    from orchestrator.trainer.api import Spool
    from orchestrator.trainer.replay_filter import Query
    replay = Spool.open("spool/run1").query(Query(reward_min=0.5, handlers=("math",), version_min=3))
    batch = GroupBatcher(pad_id=0).build(replay.groups)       # the batchers take them as they are

Rows are selected by the query (orchestrator/trainer/replay_filter.py); a group with one
selected row comes back whole (every row sharing its group_id, in whichever shard or writer it
landed), as `reader.groups()` gives them: rows are dicts, number lists numpy arrays.

Two scans of the committed shards, each shard a pyarrow.dataset fragment with a filter pushed
down (row groups whose statistics exclude it are skipped unread; rows are filtered in Arrow):
the first keeps the rows the query selects and reads their group_id only; the second reads the
asked columns of every row of those groups.
Shards are found by spool/shardlog.py's listing and opened as spool/shard_file.py opens them;
one that cannot be read is named in `skipped` and in a warning (it is left where it is:
recovery quarantines shards, docs/robustness.md), and the others are read.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.quarantine import READ_ERRORS, warn_skipped
from orchestrator.spool.rows import SCHEMA
from orchestrator.spool.shard_file import shard_fragment
from orchestrator.spool.shardlog import list_shards
from orchestrator.trainer.replay_filter import Query, QueryError
from orchestrator.trainer.tail import GROUP_COLUMNS, TRAINER_COLUMNS, Row, table_rows

READ_THREADS = 4   # Arrow decodes without the GIL: shards are scanned side by side


@dataclass(frozen=True)
class Replay:
    groups: list[list[Row]]          # whole groups, by group_id; rows by sample_index
    rows_scanned: int                # rows of every shard read
    rows_selected: int               # rows the query selected (their groups are returned whole)
    shards_read: int
    skipped: tuple[str, ...] = ()    # "shards/NAME: why", one per shard that could not be read
    incomplete_groups: int = 0       # groups left out by complete=True (fewer rows than group_size)

    @property
    def rows(self) -> int:
        return sum(len(group) for group in self.groups)


def query_groups(paths: SpoolPaths, query: Query = Query(), columns: Sequence[str] | None = TRAINER_COLUMNS,
                 complete: bool = False) -> Replay:
    """The groups of the run's committed shards with a row `query` selects; `columns` of their
    rows (None: every column); `complete` leaves out groups with fewer rows than group_size."""
    wanted = list(dict.fromkeys([*GROUP_COLUMNS, *(SCHEMA.names if columns is None else columns)]))
    unknown = [c for c in wanted if SCHEMA.get_field_index(c) < 0]
    if unknown:
        raise QueryError(f"unknown shard column(s) {unknown}; valid: {', '.join(SCHEMA.names)}")
    listing = list_shards(paths)
    skipped = [_skip(name, "not named as a shard (WRITER-SEQ.parquet): not read") for name in listing.foreign]
    files = [paths.shards / name for name in listing.committed]
    selection = query.expression()
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="replay-scan") as pool:
        selected: list[pa.Array] = []
        if selection is not None:   # pass 1: the group_id of every selected row
            needed = _schema(list(dict.fromkeys(["group_id", *sorted(query.columns())])))
            files, scans = _readable(files, pool.map(lambda f: _read_one(f, needed, ["group_id"], selection), files),
                                     skipped)
            selected = [scan.column(0).combine_chunks() for scan, _ in scans]
        chosen = pa.concat_arrays(selected).unique().sort() if selected else pa.array([], pa.string())
        whole = None if selection is None else _GroupSet(chosen)
        # pass 2: every row of those groups
        schema = _schema(wanted)
        files, tables = _readable(files, pool.map(lambda f: _read_one(f, schema, wanted, whole), files), skipped)
    groups, incomplete = _grouped([table for table, _ in tables], complete)
    return Replay(groups, rows_scanned=sum(rows for _, rows in tables),
                  rows_selected=sum(len(s) for s in selected) if selection is not None else sum(len(g) for g in groups),
                  shards_read=len(files), skipped=tuple(skipped), incomplete_groups=incomplete)


Read = tuple[pa.Table, int]   # the rows kept of a shard, and how many it has


def _readable(files: list[Path], results: Iterable[Read | str], skipped: list[str]) -> tuple[list[Path], list[Read]]:
    """The files read and their tables; each one that could not be read named in `skipped`."""
    kept, tables = [], []
    for path, result in zip(files, results):
        if isinstance(result, str):
            skipped.append(_skip(path.name, result))
        else:
            kept.append(path)
            tables.append(result)
    return kept, tables


def _skip(name: str, why: str) -> str:
    warn_skipped(name, why)
    return f"shards/{name}: {why}"


@dataclass(frozen=True)
class _GroupSet:
    """The rows of chosen groups; a row group whose group_id range holds none of them is not read.
    (Arrow prunes row groups by comparisons, not by `isin`: the range check is done here. Groups
    mostly land in one writer's shards in submission order, so few shards hold any.)"""

    ids: pa.Array   # sorted

    def __post_init__(self) -> None:
        object.__setattr__(self, "_sorted", self.ids.to_pylist())

    def row_groups(self, fragment: ds.ParquetFileFragment) -> list[int]:
        meta, wanted = fragment.metadata, self._sorted   # type: ignore[attr-defined]
        kept = []
        for index in range(meta.num_row_groups):
            stats = _group_id_statistics(meta.row_group(index))
            if stats is None or wanted[bisect.bisect_left(wanted, stats[0]):bisect.bisect_right(wanted, stats[1])]:
                kept.append(index)
        return kept


def _group_id_statistics(row_group: Any) -> tuple[str, str] | None:
    for j in range(row_group.num_columns):
        column = row_group.column(j)
        if column.path_in_schema == "group_id":
            stats = column.statistics
            return (stats.min, stats.max) if stats is not None and stats.has_min_max else None
    return None


def _schema(names: list[str]) -> pa.Schema:
    """The scan's schema: the shard columns it reads or filters on (the whole SCHEMA costs 3x more
    per shard; a column the shard lacks reads as nulls)."""
    return pa.schema([SCHEMA.field(name) for name in names])


def _read_one(path: Path, schema: pa.Schema, columns: list[str],
              selection: ds.Expression | _GroupSet | None) -> Read | str:
    """`columns` of the rows of one shard `selection` keeps; or why the shard cannot be read."""
    try:
        fragment = shard_fragment(path)
        rows = fragment.metadata.num_rows
        if isinstance(selection, _GroupSet):
            holding = selection.row_groups(fragment)
            if not holding:
                return schema.empty_table(), rows
            fragment = fragment.subset(row_group_ids=holding)
            selection = ds.field("group_id").isin(selection.ids)
        return fragment.to_table(schema=schema, columns=columns, filter=selection), rows
    except READ_ERRORS as exc:
        if isinstance(exc, FileNotFoundError):
            return "vanished while reading (moved to quarantine?)"
        return f"unreadable: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _grouped(tables: list[pa.Table], complete: bool) -> tuple[list[list[Row]], int]:
    """Rows by group_id then sample_index, each job once (a row committed twice is one sample);
    sorted and cut in Arrow, so only the rows returned become dicts."""
    table = pa.concat_tables(tables) if tables else pa.table({})
    if not table.num_rows:
        return [], 0
    table = table.sort_by([("group_id", "ascending"), ("sample_index", "ascending"), ("job_id", "ascending")])
    jobs, groups = table.column("job_id").combine_chunks(), table.column("group_id").combine_chunks()
    repeated = pc.equal(jobs.slice(1), jobs.slice(0, len(jobs) - 1)).fill_null(False)
    if pc.any(repeated).as_py():
        table = table.filter(pa.concat_arrays([pa.array([True]), pc.invert(repeated)]))
        groups = table.column("group_id").combine_chunks()
    changes = pc.not_equal(groups.slice(1), groups.slice(0, len(groups) - 1)).fill_null(True)
    starts = [0, *(pc.indices_nonzero(changes).to_numpy() + 1).tolist(), table.num_rows]
    rows = table_rows(table)
    result, incomplete = [], 0
    for first, end in zip(starts[:-1], starts[1:]):
        size = rows[first].get("group_size")
        if complete and size is not None and end - first < size:
            incomplete += 1
            continue
        result.append(rows[first:end])
    return result, incomplete
