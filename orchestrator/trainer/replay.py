"""Replay: the finished trajectories of a run, selected by a query, as whole groups.

    from orchestrator.trainer.api import Spool
    from orchestrator.trainer.replay_filter import Query
    replay = Spool.open("spool/run1").query(Query(reward_min=0.5, handlers=("math",), version_min=3))
    batch = GroupBatcher(pad_id=0).build(replay.groups)       # the batchers take them as they are

Rows are selected by the query (orchestrator/trainer/replay_filter.py); a group with one
selected row comes back whole (every row sharing its group_id, in whichever shard or writer it
landed), as `reader.groups()` gives them: rows are dicts, number lists numpy arrays.

Two scans of the committed shards, each shard a pyarrow.dataset fragment with the query pushed
down: the first reads group_id and the query's columns only and finds the groups selected;
the second decodes the asked columns of those groups' rows only, in the shards that hold them.
Shards are found by spool/shardlog.py's listing and opened as spool/shard_file.py opens them;
one that cannot be read is named in `skipped` and in a warning (it is left where it is:
recovery quarantines shards, docs/robustness.md), and the others are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

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
    groups: list[list[Row]]          # whole groups, in the order their first row was found
    rows_scanned: int                # rows of every shard read
    rows_selected: int               # rows the query selected (their groups are returned whole)
    shards_read: int
    skipped: tuple[str, ...] = ()    # "shards/NAME: why", one per shard that could not be read
    incomplete_groups: int = 0       # groups left out by complete=True (fewer rows than group_size)

    @property
    def rows(self) -> int:
        return sum(len(group) for group in self.groups)


@dataclass(frozen=True)
class _Hits:
    path: Path
    group_ids: pa.Array      # every row's group_id
    selected: pa.Array       # the group_ids of its selected rows


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
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="replay-scan") as pool:
        hits: list[_Hits] = []
        for path, found in zip(files, pool.map(lambda f: _scan_one(f, query.expression()), files)):
            if isinstance(found, str):
                skipped.append(_skip(path.name, found))
            else:
                hits.append(found)
        chosen = pa.chunked_array([h.selected for h in hits], pa.string()).unique() if hits else pa.array([], pa.string())
        holding = [h.path for h in hits if len(chosen) and pc.any(pc.is_in(h.group_ids, chosen)).as_py()]
        everything = query.is_everything()
        tables: list[pa.Table] = []
        for path, part in zip(holding, pool.map(lambda f: _fetch_one(f, wanted, None if everything else chosen), holding)):
            if isinstance(part, str):
                skipped.append(_skip(path.name, part))
            else:
                tables.append(part)
    groups, incomplete = _grouped(tables, complete)
    return Replay(groups, rows_scanned=sum(len(h.group_ids) for h in hits),
                  rows_selected=sum(len(h.selected) for h in hits), shards_read=len(hits),
                  skipped=tuple(skipped), incomplete_groups=incomplete)


def _skip(name: str, why: str) -> str:
    warn_skipped(name, why)
    return f"shards/{name}: {why}"


def _scan_one(path: Path, selection: ds.Expression | None) -> _Hits | str:
    """group_id of every row of one shard and of the rows `selection` keeps; or why it cannot be read."""
    try:
        if selection is None:
            ids = shard_fragment(path).to_table(schema=SCHEMA, columns=["group_id"]).column(0)
            return _Hits(path, ids.combine_chunks(), ids.combine_chunks())
        table = shard_fragment(path).to_table(
            schema=SCHEMA, columns={"group_id": ds.field("group_id"), "hit": selection})
        ids = table.column("group_id").combine_chunks()
        return _Hits(path, ids, ids.filter(table.column("hit").combine_chunks()))
    except READ_ERRORS as exc:
        return _why(exc)


def _fetch_one(path: Path, columns: list[str], groups: pa.Array | None) -> pa.Table | str:
    try:
        selection = None if groups is None else ds.field("group_id").isin(groups)
        return shard_fragment(path).to_table(schema=SCHEMA, columns=columns, filter=selection)
    except READ_ERRORS as exc:
        return _why(exc)


def _why(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "vanished while reading (moved to quarantine?)"
    return f"unreadable: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _grouped(tables: list[pa.Table], complete: bool) -> tuple[list[list[Row]], int]:
    """Rows by group_id, each job once (a row committed twice is one sample), by sample_index."""
    groups: dict[str, dict[str, Row]] = {}
    for table in tables:
        for row in table_rows(table):
            groups.setdefault(row["group_id"], {}).setdefault(row["job_id"], row)
    result, incomplete = [], 0
    for by_job in groups.values():
        rows = sorted(by_job.values(), key=lambda r: (r["sample_index"] is None, r["sample_index"] or 0))
        size = rows[0].get("group_size")
        if complete and size is not None and len(rows) < size:
            incomplete += 1
            continue
        result.append(rows)
    return result, incomplete
