"""Where a worker's live scalars go (orchestrator/metrics/live.py): TensorBoard event files, a W&B run.

Each package is imported when its sink is made, at worker start: missing, it is MetricsUnavailable
naming the pip install. TensorBoard is written with tensorboard's own event-file writer (no torch:
a worker should not load it for metrics).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.metrics.prometheus import MetricsUnavailable

log = logging.getLogger(__name__)

WANDB_QUEUE = 100            # steps waiting for the W&B thread; past it new steps are dropped
WANDB_FINISH_S = 30.0        # a stopping worker waits this long for W&B to finish its run


class TensorBoardSink:
    """One event file in `directory`: TensorBoard shows the directory as one run."""

    def __init__(self, directory: Path) -> None:
        try:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise MetricsUnavailable("run.toml [metrics] tensorboard_dir is set: pip install 'hpc-rollout[tensorboard]'") from None
        directory.mkdir(parents=True, exist_ok=True)
        self.writer = EventFileWriter(str(directory))

    def log(self, scalars: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        self.writer.flush()   # readers see each step at once (the writer would wait up to 2 minutes)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """One W&B run, driven from its own thread: starting a run takes seconds (minutes online with a
    bad network), and neither the worker's start nor its heartbeats (its lease) may wait for it."""

    def __init__(self, project: str, group: str, name: str, mode: str | None, directory: Path | None,
                 config: dict[str, Any]) -> None:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise MetricsUnavailable("run.toml [metrics] wandb_project is set: pip install 'hpc-rollout[wandb]'") from None
        self.name = name
        self.failed = False
        self._steps: queue.Queue[tuple[dict[str, float], int] | None] = queue.Queue(WANDB_QUEUE)
        options = {"project": project, "group": group, "name": name, "mode": mode, "job_type": "rollout-worker",
                   "dir": str(directory) if directory is not None else None, "config": config}
        self._thread = threading.Thread(target=self._serve, args=(options,), name="wandb-live", daemon=True)
        self._thread.start()

    def log(self, scalars: dict[str, float], step: int) -> None:
        if self.failed:
            return   # said once already, by the thread
        try:
            self._steps.put_nowait((scalars, step))
        except queue.Full:
            raise RuntimeError(f"W&B is {WANDB_QUEUE} steps behind: steps are dropped") from None

    def close(self) -> None:
        if not self._thread.is_alive():
            return   # its run never started (said so)
        try:
            self._steps.put(None, timeout=WANDB_FINISH_S)
        except queue.Full:
            pass
        self._thread.join(WANDB_FINISH_S)
        if self._thread.is_alive():
            raise TimeoutError(f"the W&B run of worker {self.name} did not finish within {WANDB_FINISH_S:g}s")

    def _serve(self, options: dict[str, Any]) -> None:
        import wandb

        try:
            # console off: the worker's output has its own log files; W&B would wrap its streams.
            run = wandb.init(**options, settings=wandb.Settings(console="off"))
        except Exception as exc:
            self.failed = True
            log.warning("no W&B run for worker %s: %s (nodes without network: [metrics] wandb_mode = \"offline\", "
                        "then `wandb sync`)", self.name, exc)
            return
        warned = False
        while (item := self._steps.get()) is not None:
            try:
                run.log(item[0], step=item[1])
            except Exception as exc:
                if not warned:
                    warned = True
                    log.warning("W&B run of worker %s: cannot log: %s", self.name, exc)
        run.finish()
