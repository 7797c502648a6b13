"""The cluster view routing decides by: one shared file instead of one file per worker.

An exact view reads every worker's board (`backends/inflight/W.json`) and stats its heartbeat:
2 W + 1 metadata operations. That is cheap for a few workers and ruinous for a thousand
(every task started would cost the metadata server ~2,000 round trips). So:

- while the run has at most EXACT_UP_TO workers, every decision reads the boards (exact);
- beyond, decisions read `backends/load.json`, a summary of every board, at most once per
  `view_s` per process (one open), and add this worker's own counts from memory (exact);
- the summary is rebuilt by whichever worker first finds it older than its rebuild period and
  wins `backends/load.json.lock` (exclusive create). The rebuild period grows with the run
  (W / REBUILD_OPS_PER_S seconds, at least `view_s`), so the whole run spends at most about
  REBUILD_OPS_PER_S operations per second on it, however many workers there are.

Other workers' counts are then up to a rebuild period plus `view_s` old; a worker's own are
never stale, and the tie-breaks (own node, lifetime assignments, random) spread what remains.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from orchestrator import fsops
from orchestrator.llm.inflight import Load, WorkerCounts, scan_boards, total_load
from orchestrator.paths import SpoolPaths

log = logging.getLogger(__name__)

EXACT_UP_TO = 16            # workers: up to here a decision reads every board (<= 33 operations)
DEFAULT_VIEW_S = 1.0        # a process re-reads the summary at most this often
REBUILD_OPS_PER_S = 500.0   # what the whole run spends on rebuilding the summary, at most
STALE_LOCK_S = 30.0         # a rebuild takes milliseconds: a lock this old belongs to a dead worker


@dataclass(frozen=True)
class Summary:
    """`backends/load.json`: every worker's counts as of `built_at`."""

    built_at: float
    workers: dict[str, WorkerCounts]

    def to_json(self) -> dict[str, Any]:
        return {"built_at": self.built_at,
                "workers": {w: {"inflight": c.inflight, "assigned": c.assigned, "alive": c.alive}
                            for w, c in self.workers.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Summary":
        return cls(float(data["built_at"]), {
            str(w): WorkerCounts(dict(c.get("inflight") or {}), dict(c.get("assigned") or {}), bool(c.get("alive")))
            for w, c in (data.get("workers") or {}).items()
        })

    def rebuild_due(self, now: float, view_s: float) -> bool:
        return now - self.built_at >= rebuild_period_s(len(self.workers), view_s)


def rebuild_period_s(workers: int, view_s: float) -> float:
    """A rebuild costs about 2 W operations: one per W / REBUILD_OPS_PER_S seconds keeps the run's total flat."""
    return max(view_s, 2 * workers / REBUILD_OPS_PER_S)


@dataclass
class ClusterView:
    """One process's access to the cluster's load: exact on small runs, the summary on large ones."""

    paths: SpoolPaths
    lease_s: float
    view_s: float = DEFAULT_VIEW_S
    _summary: Summary | None = field(default=None, repr=False)
    _read_at: float = field(default=-1e18, repr=False)
    _others: tuple[str, Load] | None = field(default=None, repr=False)   # (own worker id, the others' sums)

    @property
    def summary_file(self) -> Any:
        return self.paths.backends_inflight.parent / "load.json"

    @property
    def lock_file(self) -> Any:
        return self.paths.backends_inflight.parent / "load.json.lock"

    def load(self, own: Any, now: float | None = None) -> Load:
        """In-flight and lifetime counts per backend, `own` (an InflightBoard) from memory."""
        now = time.time() if now is None else now
        if self._summary is None or now - self._read_at >= self._period():
            self._summary = self._current(now)
            self._read_at = now
            self._others = None
        if self._others is None or self._others[0] != own.worker_id:
            # The other workers' sums change only with the summary: add them up once per read.
            others = {w: c for w, c in self._summary.workers.items() if w != own.worker_id}
            self._others = (own.worker_id, total_load(others))
        base = self._others[1]
        return Load(_plus(base.inflight, own.inflight), _plus(base.assigned, own.assigned), base.live_workers + 1)

    @property
    def publish_every_s(self) -> float:
        """How often a worker's own board is worth publishing: others read it only through the summary."""
        summary = self._summary
        return rebuild_period_s(len(summary.workers), self.view_s) if self._large(summary) and summary else 0.0

    def _large(self, summary: Summary | None) -> bool:
        return self.view_s > 0 and summary is not None and len(summary.workers) > EXACT_UP_TO

    def _period(self) -> float:
        return self.view_s if self._large(self._summary) else 0.0

    def _current(self, now: float) -> Summary:
        if self.view_s > 0 and (self._summary is None or self._large(self._summary)):
            summary = self._read_summary()
            if self._large(summary):
                assert summary is not None
                if not summary.rebuild_due(now, self.view_s):
                    return summary
                return self._rebuild_if_first(now) or summary
        workers = scan_boards(self.paths, self.lease_s, now=now)
        summary = Summary(now, workers)
        if self._large(summary):   # the run just grew past exact reading: publish for everyone
            self._write(summary)
        return summary

    def _rebuild_if_first(self, now: float) -> Summary | None:
        if not fsops.create_exclusive(self.lock_file):
            self._break_stale_lock(now)
            return None
        try:
            summary = Summary(now, scan_boards(self.paths, self.lease_s, now=now))
            self._write(summary)
            return summary
        finally:
            fsops.unlink(self.lock_file)

    def _write(self, summary: Summary) -> None:
        try:
            fsops.write_atomic(self.summary_file, orjson.dumps(summary.to_json()), self.paths.tmp,
                               fsops.Durability.NONE)
        except OSError as exc:  # a full spool: this process still has its fresh view
            log.warning("cluster load summary not written: %s", exc)

    def _read_summary(self) -> Summary | None:
        try:
            return Summary.from_json(orjson.loads(fsops.read_bytes(self.summary_file)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _break_stale_lock(self, now: float) -> None:
        held_since = fsops.mtime(self.lock_file)
        if held_since is not None and now - held_since > STALE_LOCK_S:
            fsops.unlink(self.lock_file)   # two breakers at once only cost one extra rebuild


def _plus(counts: dict[str, int], own: dict[str, int]) -> dict[str, int]:
    total = dict(counts)
    for url, n in own.items():
        total[url] = total.get(url, 0) + n
    return total
