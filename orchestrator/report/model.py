"""Everything one report shows, computed from the spool alone (no drawing, no HTML here)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.spool.paths import SpoolPaths
from orchestrator.report.activity import JOB_EVENTS, Intervals, Occupancy, job_events, occupancy, rate, stage_intervals
from orchestrator.report.event_read import read_events
from orchestrator.report.finished import (
    FINISHED_COLUMNS, LATENCY_STAGES, FinishedStats, Percentiles, finished_stats, floats, seconds,
)
from orchestrator.report.llm_stats import (
    TURN_FIELDS, BackendUse, DownPeriod, ToolStats, VersionChange, backend_usage, down_periods, tool_stats,
    turn_latency, version_changes,
)
from orchestrator.report.outcomes import OUTCOME_COLUMNS, PassAtK, RewardGroup, pass_at_k, reward_by
from orchestrator.report.shard_read import OUTPUT_TOKENS, ShardData, read_shards
from orchestrator.report.spool_damage import missing_parts
from orchestrator.report.spool_read import WorkerInfo, read_spool_files
from orchestrator.spool.shard_reader import shard_names

ROW_COLUMNS = tuple(dict.fromkeys((*FINISHED_COLUMNS, *OUTCOME_COLUMNS, "worker", "tool_calls")))
BACKEND_EVENTS = ("llm_backend_failed",)
RATE_BINS = 60
EXAMPLE_KINDS = 10   # failure kinds whose example jobs get an inspect file


@dataclass(frozen=True, eq=False)
class RunReport:
    run_dir: str
    made_at: float
    window: tuple[float, float]                  # epoch seconds shown on time axes
    since_s: float | None
    finished: FinishedStats
    stage_seconds: dict[str, np.ndarray]         # per stage: seconds of every row, for histograms
    reward_by_version: list[RewardGroup]
    reward_by_source: list[RewardGroup]
    pass_at_k: list[PassAtK]
    intervals: Intervals
    occupancy: Occupancy
    capacity: dict[str, tuple[np.ndarray, np.ndarray]]   # stage -> (times, slots) step function
    rate_edges: np.ndarray
    jobs_per_s: np.ndarray
    tokens_per_s: np.ndarray
    turn_latency: Percentiles | None
    turn_seconds: np.ndarray
    tools: list[ToolStats]
    backends: list[BackendUse]
    down: list[DownPeriod]
    version_changes: list[VersionChange]
    turn_points: pa.Table                        # backend, sent_at, policy_version of every turn
    workers: tuple[WorkerInfo, ...]
    shards_read: int
    event_files: int
    events: int
    skipped: tuple[str, ...]                     # what could not be read, in words
    example_shards: dict[str, Path] = field(default_factory=dict)   # failure example job -> its shard
    examples: dict[str, str] = field(default_factory=dict)   # job id -> page-relative inspect file


def load_report(paths: SpoolPaths, since_s: float | None = None, pass_reward: float = 1.0,
                now: float | None = None) -> RunReport:
    now = time.time() if now is None else now
    since = now - since_s if since_s is not None else None
    shards = read_shards(paths, ROW_COLUMNS, TURN_FIELDS, since)
    events = read_events(paths, (*JOB_EVENTS, *BACKEND_EVENTS))
    spool = read_spool_files(paths)
    rows, turns = shards.rows, shards.turns
    skipped = [*missing_parts(paths, shard_names(paths)), *shards.skipped, *events.problems, *spool.problems,
               *_missing_events(rows, events.table)]
    table = events.table  # job and backend events of every worker
    begin = _first_time(rows, table, since)
    window = (begin, max(_last_time(rows, table), begin + 1.0))
    is_failure = pc.equal(table.column("event"), BACKEND_EVENTS[0])
    failure_events = table.filter(is_failure)
    shown = table.filter(pc.greater_equal(table.column("t"), window[0])) if since is not None else table
    edges = np.linspace(window[0], window[1], RATE_BINS + 1)
    finished_t = shown.filter(pc.equal(shown.column("event"), "finished")).column("t").to_numpy(zero_copy_only=False)
    turn_latency_p, turn_values = turn_latency(turns)
    finished = finished_stats(rows, pass_reward)
    coded = job_events(table)
    coded_shown = job_events(shown) if since is not None else coded
    return RunReport(
        run_dir=str(paths.root), made_at=now, window=window, since_s=since_s,
        finished=finished,
        stage_seconds={s: _present(floats(rows.column(f"{s}_s"))) for s in LATENCY_STAGES},
        reward_by_version=reward_by(rows, "policy_version_max"), reward_by_source=reward_by(rows, "data_source"),
        pass_at_k=pass_at_k(rows, pass_reward),
        intervals=stage_intervals(coded_shown, window[1]),
        occupancy=occupancy(coded, [(s.at, s.jobs) for s in spool.submissions]),
        capacity=_capacity(spool.workers, now),
        rate_edges=edges, jobs_per_s=rate(finished_t.astype(float), None, edges),
        tokens_per_s=_token_rate(rows, turns, edges),
        turn_latency=turn_latency_p, turn_seconds=turn_values,
        tools=tool_stats(rows.column("tool_calls")),
        backends=backend_usage(turns, failure_events, spool.backends),
        down=down_periods(spool.backend_history, failure_events, turns),
        version_changes=version_changes(spool.backend_history),
        turn_points=turns.select(["backend", "sent_at", "policy_version"]),
        workers=spool.workers, shards_read=shards.shards_read, event_files=events.files_read,
        events=table.num_rows, skipped=tuple(skipped), example_shards=_example_shards(finished, rows, shards),
    )


def _example_shards(finished: FinishedStats, rows: pa.Table, shards: ShardData) -> dict[str, Path]:
    """The shard of each failure example, so its full row is read from that file alone."""
    jobs = sorted({job for group in finished.failures[:EXAMPLE_KINDS] for job in group.examples})
    if not jobs:
        return {}
    where = pc.index_in(pa.array(jobs, pa.string()), value_set=rows.column("job_id")).to_pylist()
    return {job: shards.file_of(row) for job, row in zip(jobs, where) if row is not None}


def _last_time(rows: pa.Table, events: pa.Table) -> float:
    candidates = [0.0]
    if events.num_rows:
        candidates.append(pc.max(events.column("t")).as_py())
    finished = seconds(rows.column("finished_at"))
    if len(finished) and not np.isnan(finished).all():
        candidates.append(float(np.nanmax(finished)))
    return max(candidates)


def _present(values: np.ndarray) -> np.ndarray:
    return values[~np.isnan(values)]


def _first_time(rows: pa.Table, events: pa.Table, since: float | None) -> float:
    if since is not None:
        return since
    candidates = []
    if events.num_rows:
        candidates.append(pc.min(events.column("t")).as_py())
    if rows.num_rows:
        started = seconds(rows.column("submitted_at"))
        if not np.isnan(started).all():
            candidates.append(float(np.nanmin(started)))
    return min(candidates) if candidates else time.time()


def _token_rate(rows: pa.Table, turns: pa.Table, edges: np.ndarray) -> np.ndarray:
    """Sampled tokens per second, placed when each turn's answer arrived (else at the row's finish)."""
    if turns.num_rows and pc.sum(pc.is_valid(turns.column("sent_at"))).as_py():
        arrived = floats(turns.column("sent_at")) + np.nan_to_num(floats(turns.column("latency_s")))
        tokens = np.nan_to_num(floats(turns.column(OUTPUT_TOKENS)))
        return rate(arrived, tokens, edges)
    finished = seconds(rows.column("finished_at"))
    tokens = np.nan_to_num(floats(rows.column("sampled_tokens")))
    return rate(finished, tokens, edges)


def _capacity(workers: tuple[WorkerInfo, ...], now: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Slots per stage over time: each worker's pool sizes from its start to its last heartbeat."""
    found = {}
    for stage in ("init", "run", "eval"):
        times, deltas = [], []
        for worker in workers:
            size = worker.pool_sizes.get(stage, 0)
            if size and worker.started_at:
                end = worker.heartbeat_at if worker.gone else max(worker.heartbeat_at, now)
                times += [worker.started_at, end]
                deltas += [size, -size]
        order = np.argsort(times, kind="stable")
        found[stage] = (np.array(times, float)[order], np.cumsum(np.array(deltas, float)[order]))
    return found


def _missing_events(rows: pa.Table, events: pa.Table) -> list[str]:
    """Finished jobs without any event, and row writers without an event file: timelines are partial."""
    if not rows.num_rows:
        return []
    problems = []
    seen = pc.unique(events.column("job")) if events.num_rows else pa.array([], pa.string())
    without = pc.sum(pc.invert(pc.is_in(rows.column("job_id"), value_set=seen))).as_py() or 0
    if without:
        problems.append(f"{without} finished job(s) have no events: their timeline, queue and slot entries are missing")
    writers = set(pc.drop_null(pc.unique(rows.column("worker"))).to_pylist())
    with_events = set(pc.drop_null(pc.unique(events.column("worker"))).to_pylist()) if events.num_rows else set()
    for worker in sorted(writers - with_events):
        problems.append(f"no events from worker {worker} (events/{worker}.jsonl missing or empty), which wrote rows")
    return problems
