"""Reading committed shards: the one place a shard is listed, opened, decoded or found unreadable.

Every reader -- the trainer's (trainer/tail.py through spool/shard_follower.py, trainer/replay.py),
`report`, `status`, `inspect`, `demo`, recovery (spool/shards.py) -- goes through here, so that a
damaged shard is skipped the same way everywhere: the error is one of READ_ERRORS, the reason
reads the same (`unreadable_because`), and a reader that skips it says so with `warn_skipped`.

- Listing: spool/shardlog.py's `list_shards` (the one filter of committed shard names), exported
  here; it lives there because `status` of a run without shards lists them without pyarrow.
- Opening: pyarrow opens a path with a plain open(2), which follows a planted link and waits for
  ever on a planted FIFO. A shard is opened here instead (fsops.open_regular: no link followed, no
  FIFO waited on, a regular file checked on the descriptor) and its pages mapped, so Arrow decodes
  them in place as it would with `memory_map=True`.
- Decoding: a table read here is validated in full (text that is not UTF-8 fails here, not later
  in `to_pylist` of whoever holds the rows), and a column asked for that the shard lacks (an older
  writer's) reads as nulls of its type.
"""

from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rows import SCHEMA
from orchestrator.spool.shardlog import ShardListing, list_shards, shard_files, shard_names

if TYPE_CHECKING:
    import pyarrow.dataset as ds

__all__ = ["READ_ERRORS", "ShardListing", "iter_rows", "list_shards", "open_shard", "read_shard",
           "read_shard_table", "shard_files", "shard_fragment", "shard_names",
           "unreadable_because", "validated", "warn_skipped"]

log = logging.getLogger(__name__)

# What reading a damaged shard raises: Arrow's errors (a torn footer, a bad page, text that is not
# UTF-8: pa.ArrowInvalid is also a ValueError), OSError (a file gone, or not a regular file:
# safe_open.UnsafeSpoolFile) and ValueError (what Python raises decoding a value).
READ_ERRORS: tuple[type[Exception], ...] = (pa.ArrowException, OSError, ValueError)
REASON_CHARS = 200


def _mapped(path: Path) -> pa.BufferReader:
    fd, st = fsops.open_regular(path)
    try:
        pages: mmap.mmap | bytes = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if st.st_size else b""
    finally:
        os.close(fd)   # the mapping keeps the file's pages; the descriptor is not needed
    return pa.BufferReader(pa.py_buffer(pages))


def open_shard(path: Path) -> pq.ParquetFile:
    """The Parquet file at `path` (UnsafeSpoolFile when it is no regular file; an empty or torn
    one fails to decode like a path would: pa.ArrowInvalid). Decode with `validated`."""
    return pq.ParquetFile(_mapped(path))


def shard_fragment(path: Path) -> ds.ParquetFileFragment:
    """The shard as a pyarrow.dataset fragment, for scans with filters pushed down (row groups
    skipped by their statistics, rows filtered as they are decoded); opened as open_shard does.
    pyarrow.dataset is imported here: it pulls pandas in (~0.4 s), which a worker never needs."""
    import pyarrow.dataset as ds

    return ds.ParquetFileFormat().make_fragment(_mapped(path))


def validated(table: pa.Table) -> pa.Table:
    """`table`, checked in full (pa.ArrowInvalid otherwise): bad offsets, text that is not UTF-8."""
    table.validate(full=True)
    return table


def read_shard_table(path: Path, columns: list[str] | None = None, use_threads: bool = True) -> pa.Table:
    """The columns of one shard (all when None), in the order asked; one the shard lacks reads as
    nulls (typed as in rows.SCHEMA)."""
    parquet = open_shard(path)
    if columns is None:
        return validated(parquet.read(use_threads=use_threads))
    present = set(parquet.schema_arrow.names)
    table = validated(parquet.read(columns=[c for c in columns if c in present], use_threads=use_threads))
    if len(present.intersection(columns)) == len(set(columns)):
        return table
    arrays = [table.column(c) if c in present else pa.nulls(table.num_rows, _type_of(c)) for c in columns]
    return pa.table(arrays, names=list(columns))


def _type_of(column: str) -> pa.DataType:
    at = SCHEMA.get_field_index(column)
    return SCHEMA.field(at).type if at >= 0 else pa.null()


def read_shard(path: Path) -> list[dict[str, Any]]:
    return read_shard_table(path).to_pylist()


def iter_rows(paths: SpoolPaths) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(shard name, rows) of every committed shard: a whole-spool scan for tests and reports.

    Trainers follow new rows with orchestrator.trainer.tail.RowReader and its lossless cursor.
    """
    for name in shard_names(paths):
        try:
            rows = read_shard(paths.shards / name)
        except READ_ERRORS as exc:  # skipped (the cursor moves past it), never fatal to a reader
            warn_skipped(name, unreadable_because(exc))
            rows = []
        yield name, rows



def unreadable_because(exc: BaseException) -> str:
    """Why a shard could not be read, in one line (one of READ_ERRORS)."""
    if isinstance(exc, FileNotFoundError):
        return "vanished while reading (moved to quarantine?)"
    first = str(exc).splitlines()[0][:REASON_CHARS] if str(exc) else ""
    return f"{type(exc).__name__}: {first}"


def warn_skipped(name: str, problem: str) -> None:
    log.warning("skipping unreadable shard %s: %s", name, problem)
