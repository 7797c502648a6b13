"""Reward by policy version and by data source; pass@k per data source (for eval runs).

pass@k uses the unbiased estimator over each group of n finished samples with c passing:
1 - C(n-c, k) / C(n, k), averaged over the groups with at least k samples. A sample passes
when its reward is >= pass_reward; cancelled samples do not count as samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.report.finished import floats

OUTCOME_COLUMNS = ("group_id", "data_source", "status", "reward", "policy_version_max")
NO_VERSION = "none"


@dataclass(frozen=True, eq=False)
class RewardGroup:
    key: str
    count: int
    mean: float
    std: float
    values: np.ndarray = field(repr=False)   # the rewards, for the distribution plot


@dataclass(frozen=True)
class PassAtK:
    data_source: str
    groups: int
    samples_per_group: int       # the largest group
    at_k: dict[int, float]       # k -> pass@k


def reward_by(rows: pa.Table, column: str) -> list[RewardGroup]:
    """Rewards grouped by `column` (policy_version_max or data_source), groups in natural order."""
    reward = floats(rows.column("reward"))
    keys = pc.fill_null(pc.cast(rows.column(column), pa.string()), NO_VERSION).to_numpy(zero_copy_only=False)
    has = ~np.isnan(reward)
    if not has.any():
        return []
    names, members = np.unique(keys[has].astype(str), return_inverse=True)
    rewarded = reward[has]
    found = []
    for index, key in enumerate(names):
        values = rewarded[members == index]
        found.append(RewardGroup(str(key), len(values), float(values.mean()), float(values.std()), values))
    numeric = all(g.key.lstrip("-").isdigit() for g in found if g.key != NO_VERSION)
    return sorted(found, key=lambda g: (g.key == NO_VERSION, int(g.key) if numeric and g.key != NO_VERSION else 0, g.key))


def _pass_at_k(n: np.ndarray, c: np.ndarray, k: int, log_factorial: np.ndarray) -> np.ndarray:
    """pass@k of each group, with C(n-c, k) / C(n, k) from log factorials (no overflow)."""
    fails = n - c
    possible = fails >= k
    safe = np.where(possible, fails, k)
    log_ratio = (log_factorial[safe] - log_factorial[safe - k]) - (log_factorial[n] - log_factorial[n - k])
    return np.where(possible, 1.0 - np.exp(log_ratio), 1.0)


def pass_at_k(rows: pa.Table, pass_reward: float) -> list[PassAtK]:
    kept = rows.filter(pc.not_equal(rows.column("status"), "cancelled"))
    if not kept.num_rows:
        return []
    reward = floats(kept.column("reward"))
    passed = pa.array(np.nan_to_num(reward, nan=-np.inf) >= pass_reward)
    table = pa.table({"data_source": kept.column("data_source"), "group_id": kept.column("group_id"),
                      "passed": pc.cast(passed, pa.int64())})
    grouped = table.group_by(["data_source", "group_id"]).aggregate([("passed", "count"), ("passed", "sum")])
    sources = np.array(grouped.column("data_source").to_pylist(), dtype=object)
    n = grouped.column("passed_count").to_numpy().astype(int)
    c = grouped.column("passed_sum").to_numpy().astype(int)
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n.max() + 1)))])
    found = []
    for source in sorted(set(sources.tolist()), key=str):
        mine = sources == source
        largest = int(n[mine].max())
        ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= largest} | {largest})
        at_k = {}
        for k in ks:
            with_k = mine & (n >= k)
            at_k[k] = float(np.mean(_pass_at_k(n[with_k], c[with_k], k, log_factorial)))
        found.append(PassAtK(str(source or ""), int(mine.sum()), largest, at_k))
    return found
