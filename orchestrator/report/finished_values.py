"""The figures about finished jobs as plain values: what orchestrator.report.finished computes
from shard columns (its docstring defines each), and what `status` and `report` print.

Apart from finished.py, which needs pyarrow and numpy, so that the defaults of the options that
ask for these figures (`hpc-rollout --help`) and the figures of a run with no shard yet (its
first `status`) load neither (tests/core/test_cli_startup.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

FINISHED_COLUMNS = (
    "job_id", "status", "reward", "error_stage", "error", "init_s", "run_s", "eval_s", "queue_s",
    "sampled_tokens", "submitted_at", "run_started_at", "finished_at",
)
LATENCY_STAGES = ("init", "run", "eval", "queue")
DEFAULT_PASS_REWARD = 1.0


@dataclass(frozen=True)
class Percentiles:
    count: int
    p50: float
    p90: float
    p99: float
    mean: float
    max: float

    @classmethod
    def of(cls, values: np.ndarray) -> "Percentiles | None":
        import numpy as np   # loaded already wherever there are values to summarise

        values = values[~np.isnan(values)]
        if not len(values):
            return None
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return cls(int(len(values)), float(p50), float(p90), float(p99), float(values.mean()), float(values.max()))


@dataclass(frozen=True)
class FailureGroup:
    status: str
    stage: str
    kind: str
    count: int
    examples: tuple[str, ...]   # a few job ids, for `hpc-rollout inspect`


@dataclass(frozen=True)
class FinishedStats:
    jobs: int
    by_status: dict[str, int]
    reward_mean: float | None
    rewarded: int               # rows with a reward
    pass_reward: float
    pass_rate: float | None
    tokens: int
    span_s: float
    latency: dict[str, Percentiles]
    failures: tuple[FailureGroup, ...]

    @classmethod
    def of_no_rows(cls, pass_reward: float = DEFAULT_PASS_REWARD) -> "FinishedStats":
        """What finished_stats says of no rows at all (a run with no shard yet), without pyarrow."""
        return cls(jobs=0, by_status={}, reward_mean=None, rewarded=0, pass_reward=pass_reward, pass_rate=None,
                   tokens=0, span_s=0.0, latency={}, failures=())

    @property
    def jobs_per_s(self) -> float | None:
        return self.jobs / self.span_s if self.span_s > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.span_s if self.span_s > 0 else None

    @property
    def failure_counts(self) -> dict[str, int]:
        """Failed, timed out and cancelled rows by error kind."""
        counts: dict[str, int] = defaultdict(int)
        for group in self.failures:
            counts[group.kind] += group.count
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs, "by_status": self.by_status, "reward_mean": self.reward_mean,
            "rewarded": self.rewarded, "pass_reward": self.pass_reward, "pass_rate": self.pass_rate,
            "tokens": self.tokens, "span_s": self.span_s, "jobs_per_s": self.jobs_per_s,
            "tokens_per_s": self.tokens_per_s,
            "latency_s": {stage: asdict(p) for stage, p in self.latency.items()},
            "failure_counts": self.failure_counts,
            "failures": [asdict(f) for f in self.failures],
        }
