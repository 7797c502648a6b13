"""The commit loop: buffered rows become a shard, then the claims of those rows are dropped.

Once a shard is renamed into shards/ its rows are committed: no error after that puts them back
(they would be written twice). Its claims are then "settling": dropped by `settle`, retried until
that succeeds, before any further shard; recovery finds the rows of any claim left behind.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import dataclass
from typing import Callable

from orchestrator.sandbox.workspace import removable_workspaces
from orchestrator.spool import fsops
from orchestrator.spool.jobs import Stage
from orchestrator.spool.shards import FencedOut, UnflushedShard
from orchestrator.worker.state import WorkerState

log = logging.getLogger(__name__)

COMMIT_RETRY_S = (0.5, 30.0)   # backoff of shard commits that failed (full disk, I/O error)


@dataclass(frozen=True)
class Settling:
    """A shard renamed into shards/ (its rows committed) whose claims are still to be dropped."""

    tickets: list[str]
    shard_seq: int
    remove_workspaces_of: list[str]
    flushed: bool     # shards/ flushed since the rename


class Committer:
    def __init__(self, state: WorkerState, lose_lease: Callable[[str], None]) -> None:
        self.state = state
        self.lose_lease = lose_lease
        self.committing: list[str] = []          # tickets of the shard being written right now
        self.settling: Settling | None = None    # the last shard renamed in, while its claims are not all dropped
        self.retry_at = 0.0
        self.failures = 0
        self.workspaces_to_remove: set[str] = set()  # jobs whose host workspaces go with their row
        self.wake = asyncio.Event()   # set when the worker lets go of its last job: commit now

    def carries(self, name: str) -> bool:
        """The job's row is on its way (buffered, being written, or committed and settling)."""
        return name in self.carried()

    def carried(self) -> set[str]:
        settling = self.settling.tickets if self.settling else ()
        return set(self.state.shards.tickets) | set(self.committing) | set(settling)

    def rows_buffered(self) -> int:
        return self.state.shards.pending + len(self.committing)

    def remove_workspace_with_row(self, name: str) -> None:
        self.workspaces_to_remove.add(name)

    async def commit_if_due(self) -> None:
        shards = self.state.shards
        if time.monotonic() >= self.retry_at and (
                self.settling is not None or shards.due(idle=self.state.pools.busy(Stage.EVAL) == 0)
                or (shards.pending and not self.state.jobs.holding())):
            await self.commit()

    def worker_let_go(self) -> None:
        """A job left this worker: if it holds none any more, no row is coming to share a shard
        with the buffered ones (a trainer may be waiting for them, the last of its step): commit now."""
        if self.state.shards.pending and not self.state.jobs.holding():
            self.wake.set()

    async def commit(self) -> None:
        """Write the buffered rows as a shard (in the spool thread), then drop their tickets."""
        state = self.state
        if state.lease_lost or (self.settling is not None and not await self.settle()):
            return
        batch = state.shards.take()
        if batch is None:
            return
        self.committing = batch.tickets
        cleanup = [name for name in batch.tickets if name in self.workspaces_to_remove]
        try:
            flushed = True
            try:
                await state.in_spool_io(state.shards.write, batch, state.box.dir)
            except UnflushedShard as exc:
                log.warning("%s; its claims are dropped once a flush succeeds", exc)
                flushed = False
            self.settling = Settling(batch.tickets, state.shards.last_seq, cleanup, flushed)
        except FencedOut as exc:
            self.lose_lease(str(exc))
            return
        except OSError as exc:  # full or failing spool, nothing renamed in: keep the rows, hold the claims, retry
            state.shards.put_back(batch)
            delay = self._back_off()
            log.warning("cannot commit %d row(s) to %s (%s); retrying in %.1fs", len(batch.rows), state.paths.shards, exc, delay)
            return
        finally:
            self.committing = []
        state.counters["poisoned"] = state.shards.poisoned
        await self.settle()

    def _back_off(self) -> float:
        """Back off the next commit try; the delay."""
        self.failures += 1
        delay = min(COMMIT_RETRY_S[0] * 2 ** (self.failures - 1), COMMIT_RETRY_S[1])
        self.retry_at = time.monotonic() + delay
        return delay

    async def settle(self) -> bool:
        """Drop the claims of the committed shard `self.settling`; False (retried later) on an error."""
        settling = self.settling
        assert settling is not None
        try:
            await self.state.in_spool_io(self._drop_committed, settling)
        except OSError as exc:
            delay = self._back_off()
            log.warning("shard %d is committed, but dropping its %d claim(s) failed (%s); retrying in %.1fs",
                        settling.shard_seq, len(settling.tickets), exc, delay)
            return False
        self.settling = None
        self.failures = 0
        self.workspaces_to_remove.difference_update(settling.remove_workspaces_of)
        return True

    def _drop_committed(self, settling: Settling) -> None:
        paths, batches = self.state.paths, self.state.batches
        if not settling.flushed:
            fsops.sync_dir(paths.shards)  # the shard's name is durable before its tickets are dropped
        batches.committed(settling.tickets, settling.shard_seq)
        batches.drop_emptied()
        for name in settling.remove_workspaces_of:  # the row is durable: the job's scratch space can go
            for workspace in removable_workspaces(paths.job_dir(name)):
                shutil.rmtree(workspace, ignore_errors=True)
