"""The time axis the report's pictures share, and throughput over it.

x = 0 is the first claim (the first stage start), not the first record: a run whose jobs wait
minutes for a worker would otherwise draw minutes of nothing and squeeze the work to the right.
Throughput is a trailing-window rate on a regular grid, not a histogram: bins narrower than the
gaps between finishes draw a saw-tooth between 0 and a peak for a run that never changed pace.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

from orchestrator.report.activity import DONE
from orchestrator.report.model import RunReport

RATE_POINTS = 300        # grid points of the throughput lines: smooth at a figure's width
WINDOWS_PER_RUN = 30     # the trailing window is the shown span over this, ...
SHORTEST_WINDOW_S = 1.0  # ... but never shorter: below a second, a rate is mostly the jitter of finishes


@dataclass(frozen=True)
class TimeAxis:
    origin: float    # epoch seconds at x = 0
    end: float       # epoch seconds at the right edge
    label: str

    @property
    def span(self) -> float:
        return self.end - self.origin

    def x(self, t: np.ndarray | float) -> np.ndarray:
        return np.asarray(t, float) - self.origin


def time_axis(report: RunReport) -> TimeAxis:
    first, end = report.window
    starts = report.intervals.start
    origin = float(np.clip(starts.min(), first, end)) if len(starts) else first
    end = max(end, origin + 1e-3)   # a run whose only event is its first claim still gets a width
    when = dt.datetime.fromtimestamp(origin, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    if not len(starts):
        return TimeAxis(origin, end, f"seconds since {when} (no job claimed yet)")
    lead = origin - first
    before = "the window starts" if report.since_s is not None else "submitted"
    said = f" ({before} {_duration(lead)} before)" if lead >= 0.05 else ""
    return TimeAxis(origin, end, f"seconds since the first claim, {when}{said}")


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


@dataclass(frozen=True)
class Throughput:
    t: np.ndarray          # epoch seconds, a regular grid from the axis' origin to its end
    jobs_per_s: np.ndarray
    tokens_per_s: np.ndarray
    window_s: float


def throughput(report: RunReport, axis: TimeAxis) -> Throughput:
    width = max(SHORTEST_WINDOW_S, axis.span / WINDOWS_PER_RUN)
    grid = np.linspace(axis.origin, axis.end, RATE_POINTS)
    done = report.occupancy.times[DONE], report.occupancy.counts[DONE]
    jobs = trailing_rate(*spread_steps(*done, longest=width), grid, width, axis.origin)
    # Tokens are only known per bin of the model's histogram: each bin's are a step at its end,
    # spread like finishes (over one more bin: they may have come anywhere in theirs).
    edges = report.rate_edges
    tokens_in_bin = report.tokens_per_s * np.diff(edges)
    some = tokens_in_bin > 0
    bin_s = float(edges[1] - edges[0]) if len(edges) > 1 else 0.0
    steps = spread_steps(edges[1:][some], np.cumsum(tokens_in_bin)[some], longest=width + bin_s)
    return Throughput(grid, jobs, trailing_rate(*steps, grid, width, axis.origin), width)


def spread_steps(times: np.ndarray, totals: np.ndarray, longest: float) -> tuple[np.ndarray, np.ndarray]:
    """Knots of a running total (a step function: `totals[i]` from `times[i]` on) that instead rises
    linearly over the time since the previous step, `longest` seconds at most.

    Jobs finish in clumps (a pool's slots free together, rows are flushed together): steps under
    a trailing window make its count jump by a clump as one enters or leaves. Spread over the gap
    before it, a steady run of clumps is a steady slope; a stall longer than `longest` still
    shows as a stretch of no progress.
    """
    if not len(times):
        return np.zeros(1), np.zeros(1)
    t = np.unique(times)
    level = totals[np.searchsorted(times, t, side="right") - 1]   # the last step at each time
    previous_t = np.concatenate([[-np.inf], t[:-1]])
    previous_level = np.concatenate([[0.0], level[:-1]])
    rise_from = np.maximum(previous_t, t - longest)
    return np.column_stack([rise_from, t]).ravel(), np.column_stack([previous_level, level]).ravel()


def trailing_rate(knot_t: np.ndarray, knot_total: np.ndarray, grid: np.ndarray, width: float,
                  start: float) -> np.ndarray:
    """Per-second increase of a piecewise-linear running total over the `width` seconds before each
    grid time; near `start` over the time since `start` (nothing before it is shown)."""
    span = np.minimum(width, grid - start)
    rise = np.interp(grid, knot_t, knot_total) - np.interp(grid - np.maximum(span, 0), knot_t, knot_total)
    return np.where(span > 0, rise / np.where(span > 0, span, 1.0), 0.0)
