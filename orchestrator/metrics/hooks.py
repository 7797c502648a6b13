"""Log rollout numbers from the trainer side to Weights & Biases or TensorBoard.

    from orchestrator.trainer.api import Spool
    from orchestrator.metrics.hooks import TensorBoardHook, WandbHook

    hook = WandbHook(project="my-rl", mode="offline")       # or TensorBoardHook("runs/rollouts")
    for step, group in enumerate(Spool.open("spool/run1").reader().groups(follow=True)):
        hook.log_rows(group, step)                           # reward mean, pass rate, tokens, latency...
    hook.close()

The numbers are those of `hpc-rollout status` (orchestrator.report.finished) over the rows
given. W&B's offline mode writes to disk with no network (`wandb sync` uploads later).
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, Iterable, Literal

import pyarrow as pa

from orchestrator.report.finished import DEFAULT_PASS_REWARD, finished_stats
from orchestrator.spool.rows import SCHEMA

PREFIX = "rollout/"


def rollout_metrics(rows: Iterable[dict[str, Any]], pass_reward: float = DEFAULT_PASS_REWARD) -> dict[str, float]:
    """Scalars over `rows` (dicts as the reader yields them): reward, pass rate, tokens, latency, statuses."""
    listed = list(rows)
    table = pa.Table.from_pylist(listed, schema=SCHEMA) if listed else SCHEMA.empty_table()
    stats = finished_stats(table, pass_reward)
    metrics: dict[str, float] = {"jobs": float(stats.jobs), "sampled_tokens": float(stats.tokens)}
    if stats.reward_mean is not None:
        metrics["reward_mean"] = stats.reward_mean
    if stats.pass_rate is not None:
        metrics["pass_rate"] = stats.pass_rate
    for status, count in stats.by_status.items():
        metrics[f"status/{status}"] = float(count)
    for stage, p in stats.latency.items():
        metrics.update({f"latency/{stage}_p50_s": p.p50, f"latency/{stage}_p90_s": p.p90, f"latency/{stage}_p99_s": p.p99})
    versions = [v for r in listed if (v := r.get("policy_version_max")) is not None]
    if versions:
        metrics["policy_version_max"] = float(max(versions))
    return {PREFIX + key: value for key, value in metrics.items()}


class MetricsHook(abc.ABC):
    @abc.abstractmethod
    def log(self, metrics: dict[str, float], step: int) -> None:
        """Send scalars for one step."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release files (and the W&B run)."""

    def log_rows(self, rows: Iterable[dict[str, Any]], step: int, pass_reward: float = DEFAULT_PASS_REWARD) -> dict[str, float]:
        metrics = rollout_metrics(rows, pass_reward)
        self.log(metrics, step)
        return metrics

    def __enter__(self) -> "MetricsHook":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class WandbHook(MetricsHook):
    """A W&B run; `mode="offline"` (the default) needs no network and no account."""

    def __init__(self, project: str = "hpc-rollout", mode: Literal["online", "offline", "disabled"] = "offline", directory: str | Path | None = None,
                 **init_options: Any) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError("WandbHook needs wandb: pip install 'hpc-rollout[wandb]'") from None
        self.run = wandb.init(project=project, mode=mode, dir=str(directory) if directory else None, **init_options)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class TensorBoardHook(MetricsHook):
    """Scalars in TensorBoard event files under `log_dir`."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError("TensorBoardHook needs torch and tensorboard: pip install 'hpc-rollout[tensorboard]'") from None
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
