"""The batch files a worker holds in its claim directory, and which of their jobs are unresolved.

A batch file stays claimed until each of its jobs has its row committed in one of the worker's
shards, or has left as a ticket of its own (orchestrator/handoffs.py); then it is unlinked, one
unlink for the batch. Used from the event loop and the commit thread: one lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class OpenBatch:
    name: str
    unresolved: set[str]
    started: bool = False                 # a job of it went into a stage (else it may go back whole)
    first_shard: int | None = None        # the first of the worker's shards with a row of it


@dataclass
class HeldBatches:
    _open: dict[str, OpenBatch] = field(default_factory=dict)
    _batch_of: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, name: str, job_ids: list[str]) -> None:
        with self._lock:
            self._open[name] = OpenBatch(name, set(job_ids))
            for job_id in job_ids:
                self._batch_of[job_id] = name

    def batch_of(self, job_id: str) -> str | None:
        return self._batch_of.get(job_id)

    def names(self) -> set[str]:
        with self._lock:
            return set(self._open)

    def mark_started(self, job_id: str) -> None:
        with self._lock:
            name = self._batch_of.get(job_id)
            if name in self._open:
                self._open[name].started = True

    def started(self, name: str) -> bool:
        batch = self._open.get(name)
        return batch is not None and batch.started

    def resolve(self, job_id: str, shard_seq: int | None = None) -> str | None:
        """`job_id` is resolved (its row in shard `shard_seq`, or handed off when None); the
        name of its batch when that was its last unresolved job (the caller unlinks the file)."""
        with self._lock:
            name = self._batch_of.pop(job_id, None)
            batch = self._open.get(name) if name is not None else None
            if batch is None:
                return None
            batch.unresolved.discard(job_id)
            if shard_seq is not None and batch.first_shard is None:
                batch.first_shard = shard_seq
            if batch.unresolved:
                return None
            del self._open[batch.name]
            return batch.name

    def forget(self, name: str) -> None:
        """The batch file left whole (given back unstarted): nothing of it is ours any more."""
        with self._lock:
            batch = self._open.pop(name, None)
            for job_id in batch.unresolved if batch else ():
                self._batch_of.pop(job_id, None)

    def blocked_from(self) -> int | None:
        """The first shard holding a row of a batch still claimed: recovery must read from it on
        (its job ids tell which jobs of the batch are done), so `dropped_through` stays below."""
        with self._lock:
            seqs = [b.first_shard for b in self._open.values() if b.first_shard is not None]
        return min(seqs) if seqs else None
