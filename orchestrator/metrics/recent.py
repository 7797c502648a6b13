"""The jobs one worker finished in the last minute, for its live metrics (orchestrator/metrics/live.py).

The worker adds each row as it buffers it; the heartbeat thread reads the window. Only the
columns the finished-job figures need are kept (orchestrator/report/finished_values.py), so the
window costs a few hundred bytes per job.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from orchestrator.report.finished_values import FINISHED_COLUMNS

WINDOW_S = 60.0          # as `hpc-rollout status`'s "last minute"
MAX_ROWS = 20_000        # a bound on memory whatever the rate (past it, rates read low)


class RecentJobs:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.started = time.monotonic()
        self.sampled_tokens = 0     # by every job this worker finished, not only the window's
        self._rows: deque[tuple[float, dict[str, Any]]] = deque(maxlen=MAX_ROWS)
        self._lock = threading.Lock()   # added to from the event loop, read from the heartbeat thread

    def add(self, row: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            self._rows.append((now, {name: row.get(name) for name in FINISHED_COLUMNS}))
            self.sampled_tokens += int(row.get("sampled_tokens") or 0)
            self._drop_before(now - self.window_s)

    def window(self) -> tuple[list[dict[str, Any]], float]:
        """The rows of the window, and how long it is (shorter while the worker is younger)."""
        now = time.monotonic()
        with self._lock:
            self._drop_before(now - self.window_s)
            rows = [row for _, row in self._rows]
        return rows, min(self.window_s, now - self.started)

    def _drop_before(self, oldest: float) -> None:
        while self._rows and self._rows[0][0] < oldest:
            self._rows.popleft()
