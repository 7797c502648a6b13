"""Numbers about finished jobs, from shard columns: what `status` and `report` both print.

Every figure here has one definition (documented in README, "Reading a run"):
    reward mean   mean of the non-null rewards of all finished rows
    pass rate     share of finished, not cancelled rows whose reward >= pass_reward
    tokens        sum of sampled_tokens (tokens the model sampled)
    span          first RUN start (else submission) to the last finish of the rows
    latency       p50 / p90 / p99 (numpy's linear interpolation) of the seconds spent in each
                  stage, and waiting in queues, over the rows that have the value
    failures      rows not `ok`, by status, stage and error kind (the text before the first ':')
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# The values themselves live in finished_values (no pyarrow there); imported from here as ever.
from orchestrator.report.finished_values import (
    DEFAULT_PASS_REWARD, FINISHED_COLUMNS, LATENCY_STAGES, FailureGroup, FinishedStats, Percentiles,
)

EXAMPLES_PER_FAILURE = 3


def seconds(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Epoch seconds (float, NaN for null) of a timestamp column."""
    micros = pc.cast(column, pa.int64())
    return pc.divide(pc.cast(micros, pa.float64()), 1e6).to_numpy(zero_copy_only=False).astype(float)


def floats(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False).astype(float)


def error_kinds(errors: pa.ChunkedArray | pa.Array) -> pa.Array:
    """`kind` of each `kind: message` error text (null stays null)."""
    parts = pc.split_pattern(errors, ": ", max_splits=1)
    return pc.list_element(parts, 0)


def finished_stats(rows: pa.Table, pass_reward: float = DEFAULT_PASS_REWARD) -> FinishedStats:
    status = rows.column("status")
    by_status = {str(k): int(v) for k, v in zip(*_value_counts(status))}
    reward = floats(rows.column("reward"))
    has_reward = ~np.isnan(reward)
    eligible = pc.not_equal(status, "cancelled").to_numpy(zero_copy_only=False)
    eligible = np.asarray(eligible, dtype=bool) if len(eligible) else np.zeros(0, bool)
    passed = has_reward & (np.nan_to_num(reward, nan=-np.inf) >= pass_reward)
    tokens = pc.sum(rows.column("sampled_tokens")).as_py() or 0
    latency = {}
    for stage in LATENCY_STAGES:
        found = Percentiles.of(floats(rows.column(f"{stage}_s")))
        if found is not None:
            latency[stage] = found
    return FinishedStats(
        jobs=rows.num_rows, by_status=by_status,
        reward_mean=float(reward[has_reward].mean()) if has_reward.any() else None,
        rewarded=int(has_reward.sum()), pass_reward=pass_reward,
        pass_rate=float(passed[eligible].mean()) if eligible.any() else None,
        tokens=int(tokens), span_s=_span(rows), latency=latency, failures=_failures(rows),
    )


def _value_counts(column: pa.ChunkedArray) -> tuple[list[Any], list[int]]:
    counts = pc.value_counts(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column)
    values = counts.field("values").to_pylist()
    numbers = counts.field("counts").to_pylist()
    pairs = sorted(((v, n) for v, n in zip(values, numbers) if v is not None), key=lambda p: str(p[0]))
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _span(rows: pa.Table) -> float:
    if not rows.num_rows:
        return 0.0
    finished = seconds(rows.column("finished_at"))
    started = seconds(rows.column("run_started_at"))
    submitted = seconds(rows.column("submitted_at"))
    begin = np.where(np.isnan(started), submitted, started)
    if np.isnan(finished).all() or np.isnan(begin).all():
        return 0.0
    return max(0.0, float(np.nanmax(finished) - np.nanmin(begin)))


def _failures(rows: pa.Table) -> tuple[FailureGroup, ...]:
    failed = rows.filter(pc.not_equal(rows.column("status"), "ok"))
    if not failed.num_rows:
        return ()
    kinds = error_kinds(failed.column("error")).to_pylist()
    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for job, status, stage, kind in zip(failed.column("job_id").to_pylist(), failed.column("status").to_pylist(),
                                        failed.column("error_stage").to_pylist(), kinds):
        groups[(status or "", stage or "-", kind or status or "")].append(job)
    found = [FailureGroup(s, st, k, len(jobs), tuple(sorted(jobs)[:EXAMPLES_PER_FAILURE]))
             for (s, st, k), jobs in groups.items()]
    return tuple(sorted(found, key=lambda g: (-g.count, g.status, g.stage, g.kind)))
