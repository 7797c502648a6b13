"""Live scalars of one worker, logged at its heartbeats to TensorBoard and/or W&B while the run goes.

Set in run.toml `[metrics]`: `tensorboard_dir` (event files in DIR/<run>/<worker>, so
`tensorboard --logdir DIR` shows every worker as a run) and `wandb_project` (one W&B run per
worker, grouped by the run's name; `wandb_mode` online | offline). The scalars:

    jobs/{claimed,finished,failed,requeued}    this worker's counters since it started
    pool/<stage>_{busy,size,occupancy}          its stage pools (stages it runs)
    held/{prepared,waiting_init,waiting_eval,buffered_rows}
    tokens/sampled                              tokens sampled by the jobs it finished
    last_minute/{jobs_per_s,tokens_per_s}       over the jobs it finished in the last minute,
    last_minute/{reward_mean,pass_rate}         defined as in `hpc-rollout status`
    last_minute/<stage>_p50_s                   (orchestrator/report/finished.py)

Metrics never stop a worker: a writer that fails is warned about once and the worker goes on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from orchestrator.config import RunConfig
from orchestrator.metrics.live_sinks import TensorBoardSink, WandbSink
from orchestrator.metrics.recent import RecentJobs
from orchestrator.spool.paths import SpoolPaths

log = logging.getLogger(__name__)

EVERY_S = 1.0   # at most one step per second, whatever the heartbeat period (W&B rate-limits)
HELD = ("prepared", "waiting_init", "waiting_eval", "buffered_rows")


class Sink(Protocol):
    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def heartbeat_scalars(info: dict[str, Any]) -> dict[str, float]:
    """The worker's own numbers, from its heartbeat record."""
    scalars = {f"jobs/{name}": float(value) for name, value in (info.get("counters") or {}).items()}
    for stage, pool in sorted((info.get("pools") or {}).items()):
        size, busy = float(pool.get("size", 0)), float(pool.get("busy", 0))
        if size > 0:   # a stage this worker does not run has nothing to show
            scalars.update({f"pool/{stage}_busy": busy, f"pool/{stage}_size": size, f"pool/{stage}_occupancy": busy / size})
    scalars.update({f"held/{key}": float(info[key]) for key in HELD if key in info})
    return scalars


def window_scalars(rows: list[dict[str, Any]], span_s: float) -> dict[str, float]:
    """Rates, reward and latency of the jobs finished in the window (`span_s` long)."""
    tokens = sum(int(row.get("sampled_tokens") or 0) for row in rows)
    scalars = {"last_minute/jobs_per_s": len(rows) / span_s if span_s > 0 else 0.0,
               "last_minute/tokens_per_s": tokens / span_s if span_s > 0 else 0.0}
    if not rows:
        return scalars
    import pyarrow as pa   # loaded already: the worker writes shards

    from orchestrator.report.finished import finished_stats
    from orchestrator.report.finished_values import FINISHED_COLUMNS
    from orchestrator.spool.rows import SCHEMA

    schema = pa.schema([SCHEMA.field(name) for name in FINISHED_COLUMNS])
    stats = finished_stats(pa.Table.from_pylist(rows, schema=schema))
    if stats.reward_mean is not None:
        scalars["last_minute/reward_mean"] = stats.reward_mean
    if stats.pass_rate is not None:
        scalars["last_minute/pass_rate"] = stats.pass_rate
    scalars.update({f"last_minute/{stage}_p50_s": p.p50 for stage, p in stats.latency.items()})
    return scalars


class LiveMetrics:
    """Logs a step to every sink at most every `every_s`; the newest record skipped meanwhile is
    logged at close, so the last step holds the worker's final counts."""

    def __init__(self, sinks: list[Sink], recent: RecentJobs, every_s: float = EVERY_S) -> None:
        self.sinks = sinks
        self.recent = recent
        self.every_s = every_s
        self.step = 0
        self._logged_at = float("-inf")
        self._pending: dict[str, Any] | None = None
        self._warned: set[str] = set()
        self._lock = threading.Lock()   # beats come from the event loop and the heartbeat thread

    def write(self, info: dict[str, Any]) -> None:
        with self._lock:
            self._pending = info
            if time.monotonic() - self._logged_at >= self.every_s:
                self._guarded("scalars", self._log)

    def close(self) -> None:
        with self._lock:
            if self._pending is not None:
                self._guarded("scalars", self._log)
            for sink in self.sinks:
                self._guarded(type(sink).__name__, sink.close)

    def _log(self) -> None:
        info, self._pending = self._pending or {}, None
        self._logged_at = time.monotonic()
        scalars = {**heartbeat_scalars(info), **window_scalars(*self.recent.window()),
                   "tokens/sampled": float(self.recent.sampled_tokens)}
        for sink in self.sinks:
            self._guarded(type(sink).__name__, sink.log, scalars, self.step)
        self.step += 1

    def _guarded(self, what: str, call: Any, *args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:   # metrics must never stop a worker: say it once, go on
            if what not in self._warned:
                self._warned.add(what)
                log.warning("live metrics (%s) failed, the worker goes on without them: %s", what, exc)


def live_metrics(paths: SpoolPaths, config: RunConfig, worker_id: str, recent: RecentJobs) -> LiveMetrics | None:
    """The worker's live metrics when run.toml sets tensorboard_dir or wandb_project, else None.
    A missing package is MetricsUnavailable, at worker start."""
    settings, run = config.metrics, paths.root.name
    sinks: list[Sink] = []
    if settings.tensorboard_dir:
        base = Path(settings.tensorboard_dir)
        directory = (base if base.is_absolute() else paths.root / base) / run / worker_id
        try:
            sinks.append(TensorBoardSink(directory))
        except OSError as exc:
            log.warning("no TensorBoard scalars for worker %s: cannot write to %s: %s", worker_id, directory, exc)
    if settings.wandb_project:
        # W&B's local files: $WANDB_DIR as W&B would have it, else the run directory (`wandb sync RUN/wandb/...`).
        wandb_dir = None if os.environ.get("WANDB_DIR") else paths.root
        sinks.append(WandbSink(project=settings.wandb_project, group=run, name=worker_id,
                               mode=settings.wandb_mode or None, directory=wandb_dir,
                               config={"run_dir": str(paths.root)}))
    return LiveMetrics(sinks, recent) if sinks else None
