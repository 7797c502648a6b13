"""LLM turns, backends and tools: latency, load per backend, switches, down periods, swaps.

Tool calls are read from the rows' `tool_calls` column (agent handlers: name, exit_code,
latency_ms, error per call); rows without calls add nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.llm.registry import Backend
from orchestrator.report.finished import Percentiles, floats
from orchestrator.report.shard_read import OUTPUT_TOKENS

TURN_FIELDS = ("backend", "policy_version", "sent_at", "latency_s", "switched_from", "model", OUTPUT_TOKENS)


@dataclass(frozen=True)
class BackendUse:
    url: str
    tasks: int                   # rows with at least one turn on it
    turns: int
    tokens: int                  # tokens it sampled
    switched_away: int           # turns that left it after it failed
    failures: int                # `llm_backend_failed` events naming it
    versions: tuple[int, ...]    # policy versions its turns carry
    models: tuple[str, ...]
    state: str                   # in backends.json now, or "removed"
    latency: Percentiles | None


@dataclass(frozen=True)
class DownPeriod:
    url: str
    start: float
    end: float | None            # None: still down when the report was made
    reason: str


@dataclass(frozen=True)
class VersionChange:
    t: float
    url: str
    change: str                  # added | version | removed
    version: int


@dataclass(frozen=True, eq=False)
class ToolStats:
    name: str
    calls: int
    errors: int
    latency: Percentiles | None
    seconds: np.ndarray = field(repr=False)


def turn_latency(turns: pa.Table) -> tuple[Percentiles | None, np.ndarray]:
    values = floats(turns.column("latency_s")) if turns.num_rows else np.zeros(0)
    return Percentiles.of(values), values[~np.isnan(values)]


def backend_usage(turns: pa.Table, failure_events: pa.Table, registry: tuple[Backend, ...]) -> list[BackendUse]:
    now = {b.url: b.state.value for b in registry}
    failures: dict[str, int] = defaultdict(int)
    for url in failure_events.column("backend").to_pylist():
        failures[url or "?"] += 1
    switched: dict[str, int] = defaultdict(int)
    for url in pc.drop_null(turns.column("switched_from")).to_pylist() if turns.num_rows else []:
        switched[url] += 1
    found = []
    used = pc.drop_null(pc.unique(turns.column("backend"))).to_pylist() if turns.num_rows else []
    for url in sorted(set(used) | set(now) | set(failures)):
        mine = turns.filter(pc.equal(turns.column("backend"), url)) if url in used else turns.slice(0, 0)
        versions = pc.drop_null(pc.unique(mine.column("policy_version"))).to_pylist() if mine.num_rows else []
        models = pc.drop_null(pc.unique(mine.column("model"))).to_pylist() if mine.num_rows else []
        found.append(BackendUse(
            url=url, tasks=len(pc.unique(mine.column("row"))) if mine.num_rows else 0, turns=mine.num_rows,
            tokens=int(pc.sum(mine.column(OUTPUT_TOKENS)).as_py() or 0) if mine.num_rows else 0,
            switched_away=switched.get(url, 0), failures=failures.get(url, 0),
            versions=tuple(sorted(int(v) for v in versions)), models=tuple(sorted(models)),
            state=now.get(url, "removed"), latency=Percentiles.of(floats(mine.column("latency_s"))) if mine.num_rows else None,
        ))
    return found


def down_periods(history: tuple[dict[str, Any], ...], failure_events: pa.Table, turns: pa.Table) -> list[DownPeriod]:
    """Down periods from the registry history; for backends the history never shows down (removed
    by a swap before they failed, or a run older than the history), from failure events up to
    the backend's next served turn."""
    found = _down_from_history(history)
    known = {p.url for p in found}
    times = failure_events.column("t").to_pylist()
    urls = failure_events.column("backend").to_pylist()
    reasons = failure_events.column("reason").to_pylist()
    from_events: list[DownPeriod] = []
    for t, url, reason in sorted(zip(times, urls, reasons), key=lambda e: e[0]):
        if url in known:
            continue
        last = next((p for p in reversed(from_events) if p.url == url), None)
        if last is not None and (last.end is None or last.end >= t):
            continue
        later = turns.filter(pc.and_(pc.equal(turns.column("backend"), url), pc.greater(turns.column("sent_at"), t)))
        end = pc.min(later.column("sent_at")).as_py() if later.num_rows else None
        from_events.append(DownPeriod(url or "?", t, end, reason or ""))
    return sorted(found + from_events, key=lambda d: (d.start, d.url))


def _down_from_history(history: tuple[dict[str, Any], ...]) -> list[DownPeriod]:
    open_since: dict[str, tuple[float, str]] = {}
    found = []
    for line in sorted(history, key=lambda h: h.get("t", 0.0)):
        url, t = str(line.get("url", "?")), float(line.get("t", 0.0))
        down = line.get("state") == "down" and line.get("change") != "removed"
        if down and url not in open_since:
            open_since[url] = (t, str(line.get("reason", "")))
        elif not down and url in open_since:
            start, reason = open_since.pop(url)
            found.append(DownPeriod(url, start, t, reason))
    found += [DownPeriod(url, start, None, reason) for url, (start, reason) in open_since.items()]
    return sorted(found, key=lambda d: (d.start, d.url))


def version_changes(history: tuple[dict[str, Any], ...]) -> list[VersionChange]:
    return [
        VersionChange(float(h.get("t", 0.0)), str(h.get("url", "?")), str(h.get("change")), int(h.get("policy_version", 0)))
        for h in sorted(history, key=lambda h: h.get("t", 0.0)) if h.get("change") in ("added", "version", "removed")
    ]


def tool_stats(calls: pa.ChunkedArray | pa.Array) -> list[ToolStats]:
    """Per tool name: calls, errors (non-zero exit or an error), latency; from the `tool_calls` column."""
    lists = calls.combine_chunks() if isinstance(calls, pa.ChunkedArray) else calls
    flat = pc.list_flatten(lists)
    if not len(flat):
        return []
    names = pc.fill_null(flat.field("name"), "?").to_numpy(zero_copy_only=False).astype(str)
    seconds_all = floats(flat.field("latency_ms")) * 1e-3
    failed = pc.or_(pc.fill_null(pc.not_equal(flat.field("exit_code"), 0), False),
                    pc.fill_null(pc.not_equal(flat.field("error"), ""), False))
    errors = np.asarray(failed.to_numpy(zero_copy_only=False), bool)
    found = []
    for name in sorted(set(names.tolist())):
        mine = names == name
        seconds = seconds_all[mine]
        seconds = seconds[~np.isnan(seconds)]
        found.append(ToolStats(str(name), int(mine.sum()), int(errors[mine].sum()), Percentiles.of(seconds), seconds))
    return found
