"""The load routing decides by: every worker's board on small runs, the cluster summary on large ones.

An exact view reads every worker's board (`backends/inflight/W.json`) and stats its heartbeat:
2 W + 1 metadata operations. That is cheap for a few workers and ruinous for a thousand
(every task started would cost the metadata server ~2,000 round trips). So:

- while the run has at most LARGE_RUN_WORKERS live workers, every decision reads the boards;
- beyond, decisions take the other workers' counts from the cluster summary
  (orchestrator/spool/cluster_summary.py: rebuilt from the heartbeats, which carry the counts there, read by
  each process about once per rebuild period) and add this worker's own counts from memory.
  Boards are then not published at all: nobody reads them.

Other workers' counts are then up to a heartbeat plus two rebuild periods old; a worker's own
are never stale, and the tie-breaks (own node, lifetime assignments, random) spread what remains.
In a worker the summary is refreshed by the worker engine (`shared`); a bare Router refreshes
its own once an exact read has seen a large run.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.spool.cluster_summary import LARGE_RUN_WORKERS, ClusterView, Summary
from orchestrator.llm.inflight import WORKER_PUBLISH_S, Load, WorkerCounts, read_load, total_load
from orchestrator.spool.paths import SpoolPaths


@dataclass
class LoadView:
    """One process's view of the cluster's load: exact on small runs, the summary on large ones."""

    paths: SpoolPaths
    lease_s: float
    cluster: ClusterView
    shared: bool = False       # True: the worker engine refreshes `cluster`; routing only reads it
    _exact_saw: int = field(default=0, repr=False)
    _others: tuple[Summary, str, Load] | None = field(default=None, repr=False)

    def load(self, own: Any, now: float | None = None) -> Load:
        """In-flight and lifetime counts per backend, `own` (an InflightBoard) from memory."""
        now = time.time() if now is None else now
        if not self.shared and (self._exact_saw > LARGE_RUN_WORKERS or self.cluster.summary is not None):
            self.cluster.refresh()
        summary = self.cluster.fresh()
        if summary is None:
            load = read_load(self.paths, self.lease_s, now=now, own=own)
            self._exact_saw = load.live_workers
            if not self.shared and load.live_workers > LARGE_RUN_WORKERS and self.cluster.summary is None:
                self.cluster.refresh()   # the run just grew past exact reading: the summary from now on
            return load
        if self._others is None or self._others[0] is not summary or self._others[1] != own.worker_id:
            # The other workers' sums change only with the summary: add them up once per read.
            others = {w: WorkerCounts(s.inflight, s.assigned, s.alive)
                      for w, s in summary.workers.items() if w != own.worker_id}
            self._others = (summary, own.worker_id, total_load(others))
        base = self._others[2]
        return Load(_plus(base.inflight, own.inflight), _plus(base.assigned, own.assigned), base.live_workers + 1)

    @property
    def publish_every_s(self) -> float:
        """How often this process's own board is worth publishing: never on a large run (its
        heartbeat carries the counts to the summary); on a small one every WORKER_PUBLISH_S in a
        worker (its loop lives as long as its tasks, so a held-back change is written when the
        period ends), at every change outside one (a script's loop may end first)."""
        if self.cluster.fresh() is not None:
            return math.inf
        return WORKER_PUBLISH_S if self.shared else 0.0


def _plus(counts: dict[str, int], own: dict[str, int]) -> dict[str, int]:
    total = dict(counts)
    for url, n in own.items():
        total[url] = total.get(url, 0) + n
    return total
