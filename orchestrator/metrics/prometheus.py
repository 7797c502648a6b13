"""A Prometheus text file per worker, for node-exporter's textfile collector.

node-exporter reads `*.prom` files of the directory given by --collector.textfile.directory;
each file is written whole under another name and renamed into place, so a scrape never sees
half a file (prometheus_client.write_to_textfile does exactly that). Set `[metrics]
prometheus_dir` in run.toml (relative paths are inside the run directory); every worker then
rewrites `hpc_rollout-<run>-<worker>.prom` with each heartbeat and removes it when it stops.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any, Iterator

from orchestrator.config import RunConfig
from orchestrator.errors import HpcRolloutError
from orchestrator.spool.paths import SpoolPaths

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'hpc-rollout[metrics]' (prometheus-client)"


class MetricsUnavailable(HpcRolloutError, RuntimeError):
    """A run.toml [metrics] setting is on but the package it needs is not installed (the message
    names the pip install): prometheus_dir here, tensorboard_dir and wandb_project in live_sinks.py."""


class TextfileExporter:
    def __init__(self, directory: Path, run: str, worker_id: str) -> None:
        if importlib.util.find_spec("prometheus_client") is None:
            raise MetricsUnavailable(f"run.toml [metrics] prometheus_dir is set: {INSTALL_HINT}")
        self.directory = directory
        self.run = run
        self.worker_id = worker_id
        self.path = directory / f"hpc_rollout-{run}-{worker_id}.prom"
        directory.mkdir(parents=True, exist_ok=True)
        self._warned = False

    def write(self, info: dict[str, Any]) -> None:
        """Rewrite the file from a heartbeat record (pools, counters, state); never raises OSError."""
        from prometheus_client import CollectorRegistry, write_to_textfile

        registry = CollectorRegistry()
        registry.register(_HeartbeatCollector(self.run, self.worker_id, info))
        try:
            write_to_textfile(str(self.path), registry)
        except OSError as exc:  # metrics must never stop a worker
            if not self._warned:
                log.warning("cannot write %s: %s", self.path, exc)
                self._warned = True

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class _HeartbeatCollector:
    """The heartbeat's numbers as metric families (counters stay counters across rewrites)."""

    def __init__(self, run: str, worker_id: str, info: dict[str, Any]) -> None:
        self.run, self.worker_id, self.info = run, worker_id, info

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        info = self.info
        base = {"run": self.run, "worker": self.worker_id, "node": str(info.get("node", ""))}
        names, values = list(base), list(base.values())
        up = GaugeMetricFamily("hpc_rollout_worker_up", "1 while the worker runs, 0 once it drains or stops",
                               labels=[*names, "state"])
        up.add_metric([*values, str(info.get("state", ""))], 1.0 if info.get("state") == "running" else 0.0)
        yield up
        beat = GaugeMetricFamily("hpc_rollout_heartbeat_timestamp_seconds", "Unix time of the last heartbeat", labels=names)
        beat.add_metric(values, float(info.get("heartbeat_at", 0.0)))
        yield beat
        slots = GaugeMetricFamily("hpc_rollout_pool_slots", "Slots of a stage pool", labels=[*names, "stage"])
        busy = GaugeMetricFamily("hpc_rollout_pool_busy", "Busy slots of a stage pool", labels=[*names, "stage"])
        for stage, pool in sorted((info.get("pools") or {}).items()):
            slots.add_metric([*values, stage], float(pool.get("size", 0)))
            busy.add_metric([*values, stage], float(pool.get("busy", 0)))
        yield slots
        yield busy
        for counter, value in sorted((info.get("counters") or {}).items()):
            family = CounterMetricFamily(f"hpc_rollout_jobs_{counter}", f"Jobs {counter} by this worker", labels=names)
            family.add_metric(values, float(value))
            yield family
        buffered = GaugeMetricFamily("hpc_rollout_buffered_rows", "Finished rows waiting for their shard", labels=names)
        buffered.add_metric(values, float(info.get("buffered_rows", 0)))
        yield buffered


def prometheus_exporter(paths: SpoolPaths, config: RunConfig, worker_id: str) -> TextfileExporter | None:
    """The worker's exporter when run.toml sets [metrics] prometheus_dir, else None."""
    setting = config.metrics.prometheus_dir
    if not setting:
        return None
    directory = Path(setting) if Path(setting).is_absolute() else paths.root / setting
    return TextfileExporter(directory, paths.root.name, worker_id)
