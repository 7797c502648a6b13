"""The worker's heartbeat: its record in workers/W.json, rewritten every few seconds, is its lease.

A beat first checks that the claim directory is still this worker's: recovery renames it away
from a worker it judged dead, and such a worker must learn it has lost its lease (fencing).
Beats run in their own thread, never queued behind a slow shard commit.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import logging
import time
from typing import Any, Callable

from orchestrator.metrics.live import live_metrics
from orchestrator.metrics.prometheus import prometheus_exporter
from orchestrator.spool import fsops
from orchestrator.spool.jobs import Stage
from orchestrator.spool.liveness import write_heartbeat
from orchestrator.worker.state import WorkerState

log = logging.getLogger(__name__)

HEARTBEAT_FAILURES_FATAL = 5


class Heartbeat:
    def __init__(self, state: WorkerState, rows_buffered: Callable[[], int], lose_lease: Callable[[str], None]) -> None:
        self.state = state
        self.rows_buffered = rows_buffered
        self.lose_lease = lose_lease
        self.metrics = prometheus_exporter(state.paths, state.config, state.worker_id)
        self.live = live_metrics(state.paths, state.config, state.worker_id, state.recent)

    def record(self) -> dict[str, Any]:
        state = self.state
        pools = {s.value: {"busy": state.pools.busy(s), "size": state.options.pool_size(s)} for s in Stage}
        jobs = state.jobs
        return {
            **state.info, "state": state.state, "pools": pools, "counters": state.counters,
            "prepared": len(jobs.prepared), "waiting_init": len(jobs.waiting_init),
            "waiting_eval": len(jobs.waiting_eval),
            "buffered_rows": self.rows_buffered(), "fs_ops": dict(fsops.OPS),
            "fs_ops_by_duty": dict(fsops.BY_DUTY),
            "shards": state.shards.progress(),
            **({"load": router.board.counts()} if (router := state.services.llm_router) is not None else {}),
            # resource classes: memory and CPUs its sandboxes hold now, the peak, the budget (worker/admission.py)
            **({"classes": admission.report()} if (admission := state.admission) is not None else {}),
        }

    def beat(self) -> None:
        """Write the record now (from the event loop: at start and at a stop)."""
        info = self.record()
        write_heartbeat(self.state.paths, self.state.worker_id, info)
        self._write_metrics(info)

    async def beat_checked(self) -> None:
        """The periodic beat: in the heartbeat thread, and only while the claims are still ours."""
        state = self.state
        if state.lease_lost:
            return
        loop = asyncio.get_running_loop()
        for attempt in range(HEARTBEAT_FAILURES_FATAL):
            try:
                held = await loop.run_in_executor(state.heartbeat_io, contextvars.copy_context().run,
                                                  self._beat_if_still_ours, self.record())
            except OSError as exc:
                log.warning("heartbeat failed (%d/%d): %s", attempt + 1, HEARTBEAT_FAILURES_FATAL, exc)
                await asyncio.sleep(0.2)
                continue
            if not held:
                self.lose_lease(f"its claim directory {state.box.dir} was taken over")
            return
        raise RuntimeError(f"spool unreachable: cannot write {state.paths.heartbeat(state.worker_id)}")

    def _beat_if_still_ours(self, record: dict[str, Any]) -> bool:
        """Refresh the lease, unless recovery has taken our claim directory (then False).

        On a full spool the record cannot be rewritten, but its mtime (the lease) can still be
        refreshed: a full disk must not make every worker look dead.
        """
        state = self.state
        if fsops.mtime(state.box.dir) is None:
            return False
        try:
            write_heartbeat(state.paths, state.worker_id, record)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            fsops.touch(state.paths.heartbeat(state.worker_id))
            return True
        self._write_metrics(record)
        return True

    def _write_metrics(self, info: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write({**info, "heartbeat_at": time.time()})
        if self.live is not None:
            self.live.write(info)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.remove()
        if self.live is not None:
            self.live.close()
