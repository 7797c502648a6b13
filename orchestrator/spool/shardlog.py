"""Shard names and the writer directory: the order readers follow, with no clock in it.

Every shard belongs to one *writer* (one worker process lifetime) and carries that writer's
sequence number: `shards/<writer>-<seq:08d>.parquet`, seq = 1, 2, 3, ... in commit order.
Clocks of different nodes never decide anything: a reader remembers, per writer, how far it
has read (see orchestrator/trainer/cursor.py), so a shard that lands "late" is still the next one of
its writer and is delivered.

Readers must find new shards without listing every shard ever written (1e5 of them on a
long run), so writers announce themselves in a small directory:

    shards/.writers/open/<writer>            created (exclusively) before the writer's first shard
    shards/.writers/closed/<writer>@<last>   renamed from open/ when the writer stops cleanly,
                                             or by recovery once its worker is found dead

A reader lists `open/` (one entry per live or crashed writer) and probes each open writer's
next shard by name: the cost of a poll grows with writers alive, not with shards written.
`closed/` is listed once when a reader starts, to finish writers that stopped meanwhile.
The `.writers` directory starts with a dot: pyarrow, DuckDB and `shards/*.parquet` skip it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths

SEQ_DIGITS = 8
SUFFIX = ".parquet"
CLOSED_SEP = "@"
INCARNATION_SEP = "+"   # a worker id reused after a restart writes as <id>+2, <id>+3, ...


def shard_name(writer: str, seq: int) -> str:
    return f"{writer}-{seq:0{SEQ_DIGITS}d}{SUFFIX}"


def parse_shard_name(name: str) -> tuple[str, int] | None:
    """(writer, seq) of a committed shard's file name, None for anything else."""
    if not name.endswith(SUFFIX) or name.startswith(("_", ".")):
        return None
    writer, sep, seq = name[: -len(SUFFIX)].rpartition("-")
    if not sep or not writer or len(seq) != SEQ_DIGITS or not seq.isdigit():
        return None
    return writer, int(seq)


def foreign_shard_name(name: str) -> bool:
    """A visible *.parquet name in shards/ that is not a committed shard's (a file someone put
    there): pyarrow, DuckDB and `shards/*.parquet` would read it; our readers skip it and say so."""
    return name.endswith(SUFFIX) and not name.startswith(("_", ".")) and parse_shard_name(name) is None


@dataclass(frozen=True)
class ShardListing:
    committed: list[str]    # by writer then sequence
    foreign: list[str]      # *.parquet files that are not named as shards (foreign_shard_name)


def list_shards(paths: SpoolPaths) -> ShardListing:
    """One listing of shards/ (the whole directory: not for polling)."""
    names = fsops.list_names(paths.shards)
    named = [(parsed, n) for n in names if (parsed := parse_shard_name(n))]
    return ShardListing([n for _, n in sorted(named)], sorted(n for n in names if foreign_shard_name(n)))


def shard_names(paths: SpoolPaths) -> list[str]:
    """Committed shards, by writer then sequence (lists the whole directory: not for polling)."""
    return list_shards(paths).committed


def shard_files(paths: SpoolPaths) -> list[Path]:
    """Committed shards (one listing), by writer and sequence."""
    return [paths.shards / name for name in shard_names(paths)]


def writers_of_worker(worker_id: str, writers: list[str]) -> list[str]:
    """The writer names a worker id used (itself, and its incarnations after restarts)."""
    return [w for w in writers if w == worker_id or w.startswith(worker_id + INCARNATION_SEP)]


@dataclass(frozen=True)
class WriterDirectory:
    """shards/.writers/{open,closed}: who writes shards, and who has stopped for good."""

    paths: SpoolPaths

    @property
    def root(self) -> Path:
        return self.paths.shards / ".writers"

    @property
    def open_dir(self) -> Path:
        return self.root / "open"

    @property
    def closed_dir(self) -> Path:
        return self.root / "closed"

    def register(self, worker_id: str) -> str:
        """Claim a writer name for this process (exclusive create); a reused id gets +N."""
        fsops.ensure_dir(self.open_dir)
        fsops.ensure_dir(self.closed_dir)
        taken = set(self.closed())
        for incarnation in range(1, 10_000):
            writer = worker_id if incarnation == 1 else f"{worker_id}{INCARNATION_SEP}{incarnation}"
            if writer in taken:
                continue
            if fsops.create_exclusive(self.open_dir / writer):
                return writer
        raise RuntimeError(f"no free writer name for worker {worker_id} in {self.open_dir}")

    def close(self, writer: str, last_seq: int) -> None:
        """The writer will commit nothing more; `last_seq` is its final shard (0: none)."""
        fsops.rename(self.open_dir / writer, self.closed_dir / f"{writer}{CLOSED_SEP}{last_seq}")

    def close_abandoned(self, writer: str, at_least: int = 0) -> bool:
        """Close a writer whose process is dead and fenced out (it can commit nothing more).

        Its last shard is found by name (O(log n) stats, from `at_least`, a sequence known to
        be committed). False when it was not open (closed already, by itself or another reaper).
        """
        return fsops.rename(self.open_dir / writer,
                            self.closed_dir / f"{writer}{CLOSED_SEP}{last_committed_seq(self.paths, writer, at_least)}")

    def open(self) -> list[str]:
        """Writers that may still commit (live, or crashed without closing)."""
        return fsops.list_names(self.open_dir)

    def closed(self) -> dict[str, int]:
        """Writers that stopped cleanly, with their last sequence number."""
        found: dict[str, int] = {}
        for entry in fsops.list_names(self.closed_dir):
            writer, sep, last = entry.rpartition(CLOSED_SEP)
            if sep and last.isdigit():
                found[writer] = int(last)
        return found

    def all_writers(self) -> list[str]:
        return sorted(set(self.open()) | set(self.closed()))


def shard_exists(paths: SpoolPaths, writer: str, seq: int) -> bool:
    fsops.count("stat")
    return os.path.exists(paths.shards / shard_name(writer, seq))


def last_committed_seq(paths: SpoolPaths, writer: str, at_least: int = 0) -> int:
    """The writer's highest shard sequence on disk (0: none), by galloping then bisecting.

    A gap of one shard (moved to quarantine) is stepped over, as readers do: the search looks
    for the last `seq` where shard seq or seq + 1 exists, which holds for every seq up to the
    last shard and for none after it.
    """
    def reached(seq: int) -> bool:
        return shard_exists(paths, writer, seq) or shard_exists(paths, writer, seq + 1)

    low, step = max(at_least, 0), 1   # low: 0 or a sequence known to be reached
    while reached(low + step):
        low, step = low + step, step * 2
    high = low + step                 # not reached
    while high - low > 1:
        middle = (low + high) // 2
        if reached(middle):
            low = middle
        else:
            high = middle
    return low
