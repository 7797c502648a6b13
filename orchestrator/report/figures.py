"""The report's pictures, drawn with matplotlib's Agg backend (no display needed) as PNG files.

Figures are made as `matplotlib.figure.Figure` objects, never through pyplot: no global figure
registry, no GUI backend chosen, and a faster import.

Every figure is always written: with no data it says so, so a page never has a broken image.
Time axes start at the first claim (time_axis.py); legends sit right of the axes, never on data.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from orchestrator.report.activity import LANES_LAID_OUT, PLACES, STAGES
from orchestrator.spool import fsops
from orchestrator.report.model import RunReport
from orchestrator.report.time_axis import TimeAxis, throughput, time_axis

STAGE_COLORS = {"init": "#4C72B0", "run": "#DD8452", "eval": "#55A868", "queue": "#8172B3", "llm turn": "#C44E52"}
DPI = 100
WIDTH_IN = 11.0


@dataclass(frozen=True)
class FigureFile:
    name: str        # file name inside report/
    title: str
    caption: str


Drawer = Callable[[RunReport], tuple[Figure, str]]


def draw_all(report: RunReport, directory: Path) -> list[FigureFile]:
    made = []
    for name, (title, draw) in DRAWERS.items():
        figure, caption = draw(report)
        # zlib level 1: a third of the encoding time of the default for files about 20% larger.
        # Drawn into memory and written new, then renamed over: savefig(path) would follow a
        # link planted in report/ and overwrite whatever it points at.
        png = io.BytesIO()
        figure.savefig(png, format="png", dpi=DPI, pil_kwargs={"compress_level": 1})
        fsops.write_atomic(directory / name, png.getvalue(), durability=fsops.Durability.NONE)
        made.append(FigureFile(name, title, caption))
    return made


def _margins(figure: Figure, left: float = 0.07, bottom: float = 0.1, top: float = 0.95, **space: float) -> None:
    # Fixed margins: constrained layout would lay every figure out twice (seconds at 1e5 jobs).
    figure.subplots_adjust(left=left, right=0.97, bottom=bottom, top=top, **space)


def _empty(message: str, height: float = 2.0) -> tuple[Figure, str]:
    figure = Figure(figsize=(WIDTH_IN, height))
    figure.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, color="#666666")
    return figure, message


def _legend_beside(axes: Axes, *args: object, fontsize: float = 8) -> Legend:
    """A legend right of the axes, its top at theirs: inside, it hid lines such as the RUN slots."""
    return axes.legend(*args, loc="upper left", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.6, fontsize=fontsize)


def _room_for_legends(figure: Figure, legends: list[Legend]) -> None:
    """Narrow the axes so the widest legend beside them fits in the figure (measured, not guessed:
    labels such as data sources have any length)."""
    renderer = FigureCanvasAgg(figure).get_renderer()
    widest = max(legend.get_window_extent(renderer).width for legend in legends)
    pad = 1.2 * legends[0].prop.get_size_in_points() * figure.dpi / 72   # borderaxespad and a margin, in pixels
    figure.subplots_adjust(right=max(0.5, 1 - (widest + pad) / figure.bbox.width))


def _timeline(report: RunReport) -> tuple[Figure, str]:
    intervals = report.intervals
    if not len(intervals):
        return _empty("no stage events: nothing ran yet, or events/ is missing")
    lanes = report.intervals.lanes
    shown = lanes[:LANES_LAID_OUT]
    height = min(2.0 + 0.12 * len(shown), 22.0)
    figure = Figure(figsize=(WIDTH_IN, height))
    axes = figure.subplots()
    _margins(figure, left=0.17, bottom=0.6 / height, top=1 - 0.2 / height)
    axis = time_axis(report)
    pixel = max(axis.span / 1500, 1e-9)
    lane, start, end = _merged_runs(intervals.lane_index(), axis.x(intervals.start), axis.x(intervals.end),
                                    pixel, len(shown))
    stage_of_lane = np.array([stage for _, stage, _ in shown], int)
    # Three quarters of the height a lane gets on the page, in points.
    width = max(1.0, 0.75 * (height - 0.8) * 72 / max(len(shown), 1))
    for stage_index, stage in enumerate(STAGES):
        mine = stage_of_lane[lane] == stage_index if len(lane) else np.zeros(0, bool)
        if mine.any():
            # A visible minimum width: sub-pixel stages (echo jobs) still show up.
            segments = np.stack([np.column_stack([start[mine], lane[mine]]),
                                 np.column_stack([np.maximum(end[mine], start[mine] + pixel), lane[mine]])], axis=1)
            axes.add_collection(LineCollection(list(segments), colors=STAGE_COLORS[stage], linewidths=width,
                                               label=stage.upper(), capstyle="butt"))
    axes.set_ylim(len(shown) - 0.5, -0.5)
    axes.set_xlim(0, axis.span)
    step = max(1, len(shown) // 40)
    axes.set_yticks(range(0, len(shown), step))
    axes.set_yticklabels([f"{w} {STAGES[s]}#{k}" for w, s, k in shown][::step], fontsize=7)
    axes.set_xlabel(axis.label)
    _room_for_legends(figure, [_legend_beside(axes)])
    opened = int(intervals.open.sum())
    caption = (f"{len(intervals)} stage executions on {len(lanes)} slots of {len(set(w for w, _, _ in lanes))} worker(s)"
               + (f"; showing the first {LANES_LAID_OUT} slots" if len(lanes) > LANES_LAID_OUT else "")
               + (f"; {opened} without an end event (running, or their worker died)" if opened else ""))
    return figure, caption


def _merged_runs(lane: np.ndarray, start: np.ndarray, end: np.ndarray, pixel: float,
                 lanes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intervals of the first `lanes` lanes, neighbours closer than a pixel merged (1e5 jobs draw fast)."""
    keep = lane < lanes
    lane, start, end = lane[keep], start[keep], end[keep]
    if not len(lane):
        return lane, start, end
    order = np.lexsort((start, lane))
    lane, start, end = lane[order], start[order], end[order]
    new_run = np.ones(len(lane), bool)  # intervals of one slot never overlap: compare with the previous end
    new_run[1:] = (lane[1:] != lane[:-1]) | (start[1:] - end[:-1] > pixel)
    firsts = np.flatnonzero(new_run)
    return lane[firsts], start[firsts], np.maximum.reduceat(end, firsts)


def _queues(report: RunReport) -> tuple[Figure, str]:
    occupancy = report.occupancy
    if occupancy.empty:
        return _empty("no job events or submissions: no queue history")
    axis = time_axis(report)
    grid = np.linspace(axis.origin, axis.end, 600)
    counts = occupancy.at(grid)
    figure = Figure(figsize=(WIDTH_IN, 5.5))
    top, bottom = figure.subplots(2, 1, sharex=True)
    _margins(figure, hspace=0.08)
    x = axis.x(grid)
    for index, color in zip(range(3), ("#4C72B0", "#DD8452", "#55A868")):
        top.step(x, counts[index], where="post", label=PLACES[index], color=color)
    top.set_ylabel("jobs waiting")
    for index, stage in zip(range(3, 6), STAGES):
        bottom.step(x, counts[index], where="post", label=f"{PLACES[index]} busy", color=STAGE_COLORS[stage])
        times, slots = report.capacity.get(stage, (np.zeros(0), np.zeros(0)))
        if len(times):
            bottom.step(axis.x(np.append(times, axis.end)), np.append(slots, slots[-1]),
                        where="post", linestyle="--", color=STAGE_COLORS[stage], alpha=0.5, label=f"{stage.upper()} slots")
    bottom.set_ylabel("busy slots")
    bottom.set_xlim(0, axis.span)
    bottom.set_xlabel(axis.label)
    _room_for_legends(figure, [_legend_beside(top), _legend_beside(bottom)])
    caption = "dashed: slots of the workers' pools from their heartbeats"
    if occupancy.unknown_start:
        caption += "; no submission records, so the INIT queue depth counts only what events show"
    return figure, caption


def _throughput(report: RunReport) -> tuple[Figure, str]:
    if not report.jobs_per_s.any() and not report.tokens_per_s.any():
        return _empty("no finished jobs in the window")
    axis = time_axis(report)
    rates = throughput(report, axis)
    figure = Figure(figsize=(WIDTH_IN, 5.0))
    top, bottom = figure.subplots(2, 1, sharex=True)
    _margins(figure, hspace=0.08)
    top.plot(axis.x(rates.t), rates.jobs_per_s, color="#4C72B0")
    top.set_ylabel("jobs/s")
    bottom.plot(axis.x(rates.t), rates.tokens_per_s, color="#C44E52")
    bottom.set_ylabel("sampled tokens/s")
    bottom.set_xlim(0, axis.span)
    bottom.set_xlabel(axis.label)
    for panel in (top, bottom):
        panel.set_ylim(bottom=0)
    bins = report.rate_edges[1] - report.rate_edges[0]
    return figure, (f"finished jobs and sampled tokens per second over the trailing {rates.window_s:.3g} s "
                    f"(each finish spread over the time since the one before, at most that long; "
                    f"tokens from bins of {bins:.3g} s)")


def _latency(report: RunReport) -> tuple[Figure, str]:
    panels = [(stage, report.stage_seconds[stage]) for stage in report.stage_seconds if len(report.stage_seconds[stage])]
    if len(report.turn_seconds):
        panels.append(("llm turn", report.turn_seconds))
    panels += [(f"tool {t.name}", t.seconds) for t in report.tools if len(t.seconds)][:8]
    if not panels:
        return _empty("no stage, turn or tool timings")
    columns = 3
    rows = (len(panels) + columns - 1) // columns
    figure = Figure(figsize=(WIDTH_IN, 2.6 * rows))
    grid = figure.subplots(rows, columns, squeeze=False)
    _margins(figure, left=0.05, bottom=0.45 / (2.6 * rows), top=1 - 0.3 / (2.6 * rows), hspace=0.55, wspace=0.2)
    for axes, (name, values) in zip(grid.flat, panels):
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        positive = values[values > 0]
        # Wide ranges on a log10 axis drawn as a linear one: a log-scaled axis costs seconds of ticks.
        logarithmic = len(positive) > 0 and positive.max() / max(positive.min(), 1e-9) > 50
        shown = np.log10(np.maximum(values, max(positive.min(), 1e-6) if len(positive) else 1e-6)) if logarithmic else values
        counts, edges = np.histogram(shown, bins=40)
        axes.stairs(counts, edges, fill=True, color=STAGE_COLORS.get(name, "#937860"), alpha=0.85)
        for value, style, label in ((p50, "-", "p50"), (p90, "--", "p90"), (p99, ":", "p99")):
            axes.axvline(np.log10(max(value, 1e-6)) if logarithmic else value, color="black", linestyle=style, linewidth=1, label=label)
        if logarithmic:  # ticks at powers of ten, labelled in seconds
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
            axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{10 ** x:g}"))
        axes.set_title(f"{name}: p50 {p50:.3g}s p90 {p90:.3g}s p99 {p99:.3g}s (n={len(values)})", fontsize=8)
        axes.set_xlabel("seconds (log scale)" if logarithmic else "seconds", fontsize=8)
        axes.tick_params(labelsize=7)
    for axes in list(grid.flat)[len(panels):]:
        axes.set_visible(False)
    # The line styles are alike in every panel: one legend, beside the first row.
    handles, labels = grid.flat[0].get_legend_handles_labels()
    _room_for_legends(figure, [_legend_beside(grid[0, min(len(panels), columns) - 1], handles, labels, fontsize=7)])
    return figure, "seconds per stage (rows), per LLM turn (turns) and per tool call (tool_calls); lines at p50, p90, p99"


def _reward(report: RunReport) -> tuple[Figure, str]:
    groups = [("policy version", report.reward_by_version), ("data source", report.reward_by_source)]
    if not any(g for _, g in groups):
        return _empty("no rewards yet")
    figure = Figure(figsize=(WIDTH_IN, 3.8))
    panels = figure.subplots(1, 2)
    _margins(figure, bottom=0.2, wspace=0.2)
    for axes, (label, found) in zip(panels, groups):
        if not found:
            axes.text(0.5, 0.5, "no data", ha="center", transform=axes.transAxes)
            continue
        axes.boxplot([g.values for g in found], showmeans=True)
        axes.set_xticks(range(1, len(found) + 1), [f"{g.key}\n(n={g.count})" for g in found], fontsize=7)
        axes.set_xlabel(label)
        axes.set_ylabel("reward")
    return figure, "box: quartiles of the reward; triangle: mean"


def _pass_at_k(report: RunReport) -> tuple[Figure, str]:
    found = [p for p in report.pass_at_k if p.samples_per_group > 1]
    if not found:
        return _empty("pass@k needs groups of 2 or more samples (submit --samples N)")
    figure = Figure(figsize=(WIDTH_IN, 3.5))
    axes = figure.subplots()
    _margins(figure, bottom=0.15)
    for entry in found:
        ks = sorted(entry.at_k)
        axes.plot(ks, [entry.at_k[k] for k in ks], marker="o", label=f"{entry.data_source} ({entry.groups} groups)")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("k")
    axes.set_ylabel("pass@k")
    axes.set_ylim(-0.02, 1.02)
    _room_for_legends(figure, [_legend_beside(axes)])
    return figure, f"a sample passes when its reward >= {report.finished.pass_reward:g}; unbiased estimator over groups"


def _failures(report: RunReport) -> tuple[Figure, str]:
    failures = report.finished.failures[:20]
    if not failures:
        return _empty("no failed, timed out or cancelled jobs")
    height = 1.2 + 0.35 * len(failures)
    figure = Figure(figsize=(WIDTH_IN, height))
    axes = figure.subplots()
    _margins(figure, left=0.3, bottom=0.55 / height, top=1 - 0.2 / height)
    colors = {"failed": "#C44E52", "timeout": "#DD8452", "cancelled": "#8C8C8C"}
    labels = [f"{f.stage} / {f.kind} ({f.status})" for f in failures]
    axes.barh(range(len(failures)), [f.count for f in failures], color=[colors.get(f.status, "#937860") for f in failures])
    axes.set_yticks(range(len(failures)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("jobs")
    return figure, "rows that did not end ok, by the stage that failed and the error's kind"


def _backends(report: RunReport) -> tuple[Figure, str]:
    backends = [b for b in report.backends if b.turns or b.failures or b.state != "removed"]
    if not backends:
        return _empty("no LLM backends used or registered")
    urls = [b.url for b in backends]
    height = 2.6 + 0.35 * len(urls) + 1.2 + 0.5 * len(urls)
    figure = Figure(figsize=(WIDTH_IN, height))
    grid = figure.add_gridspec(2, 2, height_ratios=[1 + 0.35 * len(urls), 1 + 0.5 * len(urls)])
    tasks_axes, tokens_axes, lanes = figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1]), figure.add_subplot(grid[1, :])
    _margins(figure, left=0.17, bottom=0.6 / height, hspace=0.45, wspace=0.35)
    y = np.arange(len(urls))
    tasks_axes.barh(y, [b.tasks for b in backends], color="#4C72B0")
    tasks_axes.set_xlabel("tasks (rows with a turn on it)")
    tokens_axes.barh(y, [b.tokens for b in backends], color="#C44E52")
    tokens_axes.set_xlabel("sampled tokens")
    for axes in (tasks_axes, tokens_axes):
        axes.set_yticks(y, [_short(u) for u in urls], fontsize=7)
        axes.invert_yaxis()
    axis = time_axis(report)
    legend = _turn_bands(lanes, report, urls, axis)
    lane = {u: i for i, u in enumerate(urls)}
    for period in report.down:
        if period.url in lane:
            end = period.end if period.end is not None else axis.end
            lanes.barh(lane[period.url], end - period.start, left=float(axis.x(period.start)), height=0.6,
                       color="#C44E52", alpha=0.35)
    for change in report.version_changes:
        if change.change == "version" and change.url in lane:
            lanes.axvline(float(axis.x(change.t)), color="black", linestyle=":", linewidth=1)
    lanes.set_yticks(range(len(urls)), [_short(u) for u in urls], fontsize=7)
    lanes.set_ylim(len(urls) - 0.5, -0.5)
    lanes.set_xlim(0, axis.span)
    lanes.set_xlabel(axis.label)
    if legend is not None:
        _room_for_legends(figure, [legend])
    return figure, "top: tasks and sampled tokens per backend; bottom: when it served turns (colour: policy version), down periods (red), version changes (dotted)"


def _turn_bands(axes: Axes, report: RunReport, urls: list[str], axis: TimeAxis) -> Legend | None:
    """Per backend lane, the time bins in which it served turns, coloured by policy version."""
    points = report.turn_points
    if not points.num_rows:
        return None
    backend = np.asarray(points.column("backend").to_numpy(zero_copy_only=False), dtype=object)
    sent = np.asarray(points.column("sent_at").to_numpy(zero_copy_only=False), dtype=float)
    version = points.column("policy_version").to_numpy(zero_copy_only=False)
    version = np.nan_to_num(np.asarray(version, dtype=float), nan=-1)
    edges = np.linspace(axis.origin, axis.end, 401)
    versions = sorted(set(version[~np.isnan(sent)].tolist()))
    colors = matplotlib.colormaps["viridis"](np.linspace(0, 0.9, max(len(versions), 1)))
    for lane, url in enumerate(urls):
        mine = backend == url
        for color, value in zip(colors, versions):
            counts, _ = np.histogram(sent[mine & (version == value)], bins=edges)
            bins = np.flatnonzero(counts)
            if len(bins):
                axes.broken_barh([(edges[b] - axis.origin, edges[b + 1] - edges[b]) for b in bins],
                                 (lane - 0.3, 0.6), color=color)
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in colors[:len(versions)]]
    return _legend_beside(axes, handles, [f"version {int(v)}" if v >= 0 else "no version" for v in versions], fontsize=7)


def _short(url: str) -> str:
    return url.replace("http://", "").replace("https://", "").removesuffix("/v1")


DRAWERS: dict[str, tuple[str, Drawer]] = {   # file name -> (title, drawer), in the page's order
    "timeline.png": ("Worker slots over wall time", _timeline),
    "queues.png": ("Queue depths and busy slots", _queues),
    "throughput.png": ("Throughput", _throughput),
    "latency.png": ("Latency per stage, LLM turn and tool", _latency),
    "reward.png": ("Reward by policy version and data source", _reward),
    "pass_at_k.png": ("pass@k per data source", _pass_at_k),
    "failures.png": ("Failures by stage and kind", _failures),
    "backends.png": ("LLM backends", _backends),
}
