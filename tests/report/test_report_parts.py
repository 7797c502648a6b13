"""The report's parts on small inputs whose answers are known: durations, pass@k, slot layout,
queue depths, tool calls, backend history."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from orchestrator.llm.history import read_history
from orchestrator.llm.registry import BackendRegistry, BackendState
from orchestrator.report.activity import DONE, EVAL_QUEUE, IN_RUN, INIT_QUEUE, RUN_QUEUE, job_events, occupancy, stage_intervals
from orchestrator.report.event_read import EVENT_SCHEMA
from orchestrator.report.llm_stats import down_periods, tool_stats
from orchestrator.spool.rows import TOOL_CALL_TYPE
from orchestrator.report.outcomes import pass_at_k
from orchestrator.report.since import parse_duration
from orchestrator.spool.paths import SpoolPaths


def test_durations_people_type() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "30m", "1h", "1h30m", "2d", "0.5h")] == [
        90, 90, 1800, 3600, 5400, 172800, 1800]
    for bad in ("", "1x", "h", "-5", "1h-2m"):
        with pytest.raises(ValueError, match="90s, 30m, 1h|positive"):
            parse_duration(bad)


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    rows = pa.table({
        "group_id": ["a"] * 4 + ["b"] * 4 + ["c"] * 2, "data_source": ["math"] * 8 + ["code"] * 2,
        "status": ["ok"] * 9 + ["cancelled"], "reward": [1, 0, 0, 0, 1, 1, 0, None, 1, 1],
    }, schema=pa.schema([("group_id", pa.string()), ("data_source", pa.string()), ("status", pa.string()), ("reward", pa.float64())]))
    found = {p.data_source: p for p in pass_at_k(rows, 1.0)}

    def direct(n: int, c: int, k: int) -> float:
        return 1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k)

    for k in (1, 2, 4):
        assert found["math"].at_k[k] == pytest.approx((direct(4, 1, k) + direct(4, 2, k)) / 2)
    assert found["code"].at_k == {1: 1.0} and found["code"].groups == 1  # the cancelled sample is no sample


def _events(records: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{f: r.get(f) for f in EVENT_SCHEMA.names} for r in records], schema=EVENT_SCHEMA)


def test_slots_never_overlap_and_are_as_few_as_the_peak() -> None:
    rng = np.random.default_rng(1)
    records = []
    for job in range(300):
        start = float(rng.uniform(0, 100))
        records += [{"t": start, "job": f"j{job}", "event": "run_started", "worker": f"w{job % 3}"},
                    {"t": start + float(rng.exponential(5)), "job": f"j{job}", "event": "run_finished", "worker": f"w{job % 3}"}]
    records.append({"t": 50.0, "job": "open", "event": "run_started", "worker": "w0"})   # its worker died
    intervals = stage_intervals(job_events(_events(records)), end_of_run=200.0)
    assert len(intervals) == 301 and intervals.open.sum() == 1
    for worker in ("w0", "w1", "w2"):
        mine = intervals.worker == worker
        peak = max(((intervals.start[mine] <= t) & (intervals.end[mine] > t)).sum() for t in intervals.start[mine])
        assert sum(1 for w, _, _ in intervals.lanes if w == worker) == peak
        for slot in set(intervals.slot[mine].tolist()):
            on_slot = mine & (intervals.slot == slot)
            order = np.argsort(intervals.start[on_slot])
            assert (intervals.start[on_slot][order][1:] >= intervals.end[on_slot][order][:-1]).all()


def test_queue_depths_follow_each_job() -> None:
    records = [
        {"t": 1.0, "job": "a", "event": "init_started", "worker": "w"},
        {"t": 2.0, "job": "a", "event": "init_finished", "worker": "w"},
        {"t": 3.0, "job": "a", "event": "run_started", "worker": "w"},
        {"t": 4.0, "job": "a", "event": "returned", "worker": "w", "stage": "run", "to": "init"},
        {"t": 5.0, "job": "a", "event": "requeued", "worker": "v", "to": "run@node1"},
        {"t": 6.0, "job": "b", "event": "init_started", "worker": "w"},
        {"t": 7.0, "job": "b", "event": "init_finished", "worker": "w", "status": "failed"},
        {"t": 8.0, "job": "b", "event": "finished", "worker": "w", "status": "failed"},
        {"t": 9.0, "job": "c", "event": "finished", "worker": "w", "status": "cancelled"},  # cancelled while queued
    ]
    found = occupancy(job_events(_events(records)), [(0.5, 3)])
    grid = np.array([0.7, 1.5, 2.5, 3.5, 4.5, 5.5, 7.5, 8.5, 9.5])
    counts = found.at(grid)
    assert counts[INIT_QUEUE].tolist() == [3, 2, 2, 2, 3, 2, 1, 1, 0]
    assert counts[RUN_QUEUE].tolist() == [0, 0, 1, 0, 0, 1, 1, 1, 1]
    assert counts[IN_RUN].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert counts[EVAL_QUEUE].tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 0]
    assert counts[DONE].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 2]


def test_tool_calls_from_the_column_and_rows_without_them() -> None:
    def call(name: str, ms: float, exit_code: int | None, error: str | None = None) -> dict:
        return {"turn": 1, "name": name, "arguments": "{}", "exit_code": exit_code, "output_chars": 0,
                "latency_ms": ms, "error": error, "output": ""}
    calls = pa.array([
        [call("bash", 12.0, 0), call("bash", 30.0, 2), call("python", 500.0, None, "Timeout")],
        [], None,
    ], pa.list_(TOOL_CALL_TYPE))
    found = {t.name: t for t in tool_stats(calls)}
    assert (found["bash"].calls, found["bash"].errors, found["python"].errors) == (2, 1, 1)
    assert found["bash"].latency.p50 == pytest.approx(0.021) and found["python"].latency.max == 0.5
    assert tool_stats(pa.array([[], None], pa.list_(TOOL_CALL_TYPE))) == []


def test_registry_changes_are_logged_and_give_down_periods(tmp_path: Path) -> None:
    paths = SpoolPaths.of(tmp_path)
    registry = BackendRegistry.of(paths)
    registry.add("http://node1:8000/v1", version=1)
    registry.set_state("http://node1:8000/v1", BackendState.DOWN, "connection refused")
    registry.set_state("http://node1:8000/v1", BackendState.UP)
    registry.set_state("http://node1:8000/v1", BackendState.DOWN, "again")
    registry.swap(["http://node2:8000/v1"], version=2)
    history, bad = read_history(paths.backends_history)
    assert bad == 0
    assert [(h["url"][7:12], h["change"]) for h in history] == [
        ("node1", "added"), ("node1", "state"), ("node1", "state"), ("node1", "state"), ("node2", "added"), ("node1", "removed")]
    empty = pa.table({"t": pa.array([], pa.float64()), "backend": pa.array([], pa.string()), "reason": pa.array([], pa.string())})
    periods = down_periods(tuple(history), empty, pa.table({"backend": pa.array([], pa.string()), "sent_at": pa.array([], pa.float64())}))
    assert [(p.reason, p.end is not None) for p in periods] == [("connection refused", True), ("again", True)]
    assert periods[0].end == history[2]["t"] and periods[1].end == history[5]["t"]
