"""Opening a committed shard for reading: like every spool file, then mapped for Arrow.

pyarrow opens a path with a plain open(2), which follows a planted link and waits for ever on
a planted FIFO. A shard is opened here instead (fsops.open_regular: no link followed, no FIFO
waited on, a regular file checked on the descriptor) and its pages mapped, so Arrow decodes
them in place as it would with `memory_map=True`.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.spool import fsops

if TYPE_CHECKING:
    import pyarrow.dataset as ds


def _mapped(path: Path) -> pa.BufferReader:
    fd, st = fsops.open_regular(path)
    try:
        pages: mmap.mmap | bytes = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if st.st_size else b""
    finally:
        os.close(fd)   # the mapping keeps the file's pages; the descriptor is not needed
    return pa.BufferReader(pa.py_buffer(pages))


def open_shard(path: Path) -> pq.ParquetFile:
    """The Parquet file at `path` (UnsafeSpoolFile when it is no regular file; an empty or torn
    one fails to decode like a path would: pa.ArrowInvalid)."""
    return pq.ParquetFile(_mapped(path))


def shard_fragment(path: Path) -> ds.ParquetFileFragment:
    """The shard as a pyarrow.dataset fragment, for scans with filters pushed down (row groups
    skipped by their statistics, rows filtered as they are decoded); opened as open_shard does.
    pyarrow.dataset is imported here: it pulls pandas in (~0.4 s), which a worker never needs."""
    import pyarrow.dataset as ds

    return ds.ParquetFileFormat().make_fragment(_mapped(path))


def read_shard_table(path: Path, columns: list[str] | None = None, use_threads: bool = True) -> pa.Table:
    """The columns of one shard (all when None)."""
    return open_shard(path).read(columns=columns, use_threads=use_threads)
