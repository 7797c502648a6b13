"""Numbers of a run computed straight from its shards (pyarrow.dataset + numpy + math), with no
code of orchestrator.report: what the report and `status` must agree with."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pyarrow.dataset as ds

from orchestrator.spool.paths import SpoolPaths


def all_rows(paths: SpoolPaths) -> list[dict[str, Any]]:
    return ds.dataset(paths.shards, format="parquet").to_table().to_pylist()


def direct_numbers(rows: list[dict[str, Any]], pass_reward: float = 1.0) -> dict[str, Any]:
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    counted = [r for r in rows if r["status"] != "cancelled"]
    latency = {}
    for stage in ("init", "run", "eval", "queue"):
        values = [r[f"{stage}_s"] for r in rows if r[f"{stage}_s"] is not None]
        if values:
            latency[stage] = dict(zip(("p50", "p90", "p99"), np.percentile(values, [50, 90, 99]).tolist()))
    kinds = Counter((r["error"] or r["status"]).split(": ", 1)[0] for r in rows if r["status"] != "ok")
    groups: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in counted:
        groups[(r["data_source"], r["group_id"])].append(r["reward"] is not None and r["reward"] >= pass_reward)
    pass_at_1: dict[str, float] = {}
    for source in {s for s, _ in groups}:
        mine = [v for (s, _), v in groups.items() if s == source]
        pass_at_1[source] = float(np.mean([1 - math.comb(len(v) - sum(v), 1) / math.comb(len(v), 1) for v in mine]))
    turns = [t for r in rows for t in (r["turns"] or [])]
    per_backend: dict[str, dict[str, Any]] = defaultdict(lambda: {"tasks": set(), "tokens": 0})
    for r in rows:
        for t in r["turns"] or []:
            per_backend[t["backend"]]["tasks"].add(r["job_id"])
            per_backend[t["backend"]]["tokens"] += len(t["output_ids"])
    return {
        "jobs": len(rows), "by_status": dict(Counter(r["status"] for r in rows)),
        "reward_mean": float(np.mean(rewards)) if rewards else None,
        "pass_rate": float(np.mean([r["reward"] is not None and r["reward"] >= pass_reward for r in counted])),
        "tokens": sum(r["sampled_tokens"] or 0 for r in rows),
        "turn_tokens": sum(len(t["output_ids"]) for t in turns),
        "latency": latency, "failure_counts": dict(kinds), "pass_at_1": pass_at_1,
        "backends": {url: {"tasks": len(v["tasks"]), "tokens": v["tokens"]} for url, v in per_backend.items()},
        "versions": Counter(r["policy_version_max"] for r in rows if r["reward"] is not None),
    }
