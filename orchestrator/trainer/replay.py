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
Shards are listed, opened and decoded by spool/shard_reader.py;
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
from orchestrator.spool.rows import SCHEMA
from orchestrator.spool.shard_reader import READ_ERRORS, list_shards, shard_fragment, unreadable_because, validated, warn_skipped
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
        selected: list[pa.Table] = []
        if selection is not None:   # pass 1: group_id (job_id for a row of no group) of every selected row
            needed = _schema(list(dict.fromkeys(["group_id", "job_id", *sorted(query.columns())])))
            files, scans = _readable(
                files, pool.map(lambda f: _read_one(f, needed, ["group_id", "job_id"], selection), files), skipped)
            selected = [scan for scan, _ in scans]
        whole = None if selection is None else _GroupSet.of(selected)
        # pass 2: every row of those groups
        schema = _schema(wanted)
        files, tables = _readable(files, pool.map(lambda f: _read_one(f, schema, wanted, whole), files), skipped)
    groups, incomplete = _grouped([table for table, _ in tables], complete)
    return Replay(groups, rows_scanned=sum(rows for _, rows in tables),
                  rows_selected=sum(s.num_rows for s in selected) if selection is not None else sum(len(g) for g in groups),
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


class _GroupSet:
    """The rows of chosen groups (and chosen rows of no group: a poisoned row's last-resort
    `failed` row has none); a row group whose group_id range holds none of them is not read.
    (Arrow prunes row groups by comparisons, not by `isin`: the range check is done here. Groups
    mostly land in one writer's shards in submission order, so few shards hold any.)"""

    def __init__(self, groups: pa.Array, orphans: pa.Array) -> None:
        self.groups, self.orphans = groups, orphans
        self._sorted: list[str] = groups.to_pylist()

    @classmethod
    def of(cls, selected: list[pa.Table]) -> "_GroupSet":
        if not selected:
            return cls(pa.array([], pa.string()), pa.array([], pa.string()))
        rows = pa.concat_tables(selected)
        groupless = pc.is_null(rows.column("group_id"))
        return cls(pc.drop_null(rows.column("group_id")).unique().sort(),
                   rows.column("job_id").filter(groupless).combine_chunks())

    def expression(self) -> ds.Expression:
        group_id = ds.field("group_id")
        chosen = group_id.isin(self.groups)
        if len(self.orphans):
            chosen = chosen | (group_id.is_null() & ds.field("job_id").isin(self.orphans))
        return chosen

    def row_groups(self, fragment: ds.ParquetFileFragment) -> list[int]:
        meta = fragment.metadata
        return [i for i in range(meta.num_row_groups) if self._may_hold(_group_id_statistics(meta.row_group(i)))]

    def _may_hold(self, stats: Any) -> bool:
        if stats is None:
            return True
        if len(self.orphans) and stats.null_count:
            return True
        if not stats.has_min_max:   # no range kept: unknown unless every value is null
            return bool(stats.num_values)
        return bool(self._sorted[bisect.bisect_left(self._sorted, stats.min):bisect.bisect_right(self._sorted, stats.max)])


def _group_id_statistics(row_group: Any) -> Any:
    """The group_id column's Parquet statistics in a row group (None: not kept)."""
    for j in range(row_group.num_columns):
        column = row_group.column(j)
        if column.path_in_schema == "group_id":
            return column.statistics
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
            selection = selection.expression()
        return validated(fragment.to_table(schema=schema, columns=columns, filter=selection)), rows
    except READ_ERRORS as exc:
        return unreadable_because(exc)


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
