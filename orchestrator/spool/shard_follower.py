"""Following the writers' shard sequences: which writers to look at, their next shard, decoded.

A trainer's reader (orchestrator/trainer/tail.py) holds rows and groups them; this is what it
reads with. A poll lists `shards/.writers/open/` (and `closed/` when it changed) and probes each
unfinished writer's next shard by name: about two stats per open writer, however many shards
exist. A shard missing before a closed writer's last one, or with a later one present, was
committed and moved away (quarantined): it is skipped and named, never waited for. The writer's
next shard is decoded on a thread meanwhile (Arrow decodes without the GIL), read ahead but never
taken ahead: `next_seq` moves only when a shard is taken. Between polls a reader waits on a watch
of shards/ (spool/dir_watch.py): a shard committed on this node ends the wait at once.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from orchestrator.spool import fsops
from orchestrator.spool.dir_watch import DirWatch
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shard_reader import READ_ERRORS, read_shard_table, unreadable_because, warn_skipped
from orchestrator.spool.shardlog import WriterDirectory, shard_exists, shard_name

# The list of closed writers is re-read when its directory changes, and at least this often
# (directory mtimes are coarse: two closes in one tick look like one).
CLOSED_RELIST_S = 5.0


@dataclass
class ShardFollower:
    """Each writer's next shard to take (`next_seq`, 1 for a writer never read) and the reading."""

    paths: SpoolPaths
    columns: Sequence[str] | None = None   # None: every column
    next_seq: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)      # shard names skipped, in order
    schema: pa.Schema | None = field(default=None, init=False)   # of the last shard read
    _open_seen: set[str] = field(default_factory=set, init=False)
    _closed: dict[str, int] = field(default_factory=dict, init=False)
    _closed_stamp: tuple[int, int] | None = field(default=None, init=False)
    _closed_listed_at: float = field(default=-1e18, init=False)
    _read_ahead: tuple[str, int, Future[pa.Table | None]] | None = field(default=None, init=False)
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _commits: DirWatch | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.writers = WriterDirectory(self.paths)

    def close(self) -> None:
        """Stop decoding ahead and end the read-ahead thread; `next_seq` stays valid."""
        if self._read_ahead is not None:
            self._read_ahead[2].cancel()
            self._read_ahead = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._commits is not None:
            self._commits.close()
            self._commits = None

    def wait_for_commit(self, timeout_s: float) -> None:
        """Sleep until a shard is committed on this node, or `timeout_s` at most (the poll period:
        another node's commits raise no event here; spool/dir_watch.py)."""
        if self._commits is None:   # made at the first wait: most readers never wait
            self._commits = DirWatch([self.paths.shards])
        self._commits.wait(timeout_s)

    def writers_to_probe(self) -> list[str]:
        """The open writers, then the closed ones with shards not taken yet."""
        open_now = set(self.writers.open())
        vanished = self._open_seen - open_now
        self._open_seen = open_now
        self._refresh_closed(force=bool(vanished))
        unfinished_closed = [w for w, last in self._closed.items() if self.next_seq.get(w, 1) <= last]
        return sorted(open_now - set(self._closed)) + sorted(unfinished_closed)

    def take_next(self, writer: str) -> tuple[int, pa.Table] | None:
        """The writer's next shard (its sequence number and table; empty when unreadable), moving
        `next_seq` past it and past the missing shards skipped; None when none is committed yet."""
        seq = self.next_seq.get(writer, 1)
        last = self._closed.get(writer)
        while last is None or seq <= last:
            table = self.read_table(writer, seq)
            if table is None:
                if (last is not None and seq <= last) or shard_exists(self.paths, writer, seq + 1):
                    self.skip(writer, seq, "missing (quarantined?)")
                    seq += 1
                    continue
                break
            self.next_seq[writer] = seq + 1
            return seq, table
        self.next_seq[writer] = seq
        return None

    def read_table(self, writer: str, seq: int) -> pa.Table | None:
        """One shard's columns; None when it does not exist; empty when it cannot be read (named).
        The writer's following shard is decoded meanwhile on a thread."""
        table = self._take_read_ahead(writer, seq)
        if table is None:
            if not shard_exists(self.paths, writer, seq):   # a stat is far cheaper than a failed open
                return None
            path = self.paths.shards / shard_name(writer, seq)
            try:
                table = self._decode(path)
            except FileNotFoundError:
                return None
            except READ_ERRORS as exc:  # a corrupt shard must not stop the trainer
                if not path.exists():
                    return None
                self.skip(writer, seq, unreadable_because(exc))
                return pa.table({})
        self.schema = table.schema
        self._read_ahead = (writer, seq + 1, self._executor().submit(self._decode_if_there, writer, seq + 1))
        return table

    def skip(self, writer: str, seq: int, why: str) -> None:
        name = shard_name(writer, seq)
        self.skipped.append(name)
        warn_skipped(name, f"{why} (see {self.paths.quarantine})")

    def _refresh_closed(self, force: bool) -> None:
        fsops.count("stat")
        try:
            st = self.writers.closed_dir.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        now = time.monotonic()
        if force or stamp != self._closed_stamp or now - self._closed_listed_at > CLOSED_RELIST_S:
            self._closed = self.writers.closed()
            self._closed_stamp, self._closed_listed_at = stamp, now

    def _decode(self, path: Path) -> pa.Table:
        return read_shard_table(path, None if self.columns is None else list(self.columns))

    def _decode_if_there(self, writer: str, seq: int) -> pa.Table | None:
        if not shard_exists(self.paths, writer, seq):
            return None
        return self._decode(self.paths.shards / shard_name(writer, seq))

    def _take_read_ahead(self, writer: str, seq: int) -> pa.Table | None:
        """The shard decoded ahead, if it is this one and was read whole; else None."""
        ahead, self._read_ahead = self._read_ahead, None
        if ahead is None:
            return None
        ahead_writer, ahead_seq, future = ahead
        if (ahead_writer, ahead_seq) != (writer, seq):
            future.cancel()
            return None
        try:
            return future.result()
        except READ_ERRORS:   # (OSError covers a shard gone) read again on this thread, which decides what to skip
            return None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-read-ahead")
        return self._pool
