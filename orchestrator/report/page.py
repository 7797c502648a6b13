"""The report's HTML page: one file with its CSS inline, images side by side as PNG files."""

from __future__ import annotations

import datetime as dt
from importlib import resources

import jinja2

from orchestrator.report.figures import FigureFile
from orchestrator.report.model import RunReport
from orchestrator.report.summary import summary_pairs
from orchestrator.report.time_axis import time_axis

TEMPLATE = "page.html.j2"


def render_page(report: RunReport, figures: list[FigureFile]) -> str:
    source = resources.files("orchestrator.report").joinpath(TEMPLATE).read_text()
    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    latency = [(stage, p) for stage, p in report.finished.latency.items()]
    if report.turn_latency is not None:
        latency.append(("llm turn", report.turn_latency))
    latency += [(f"tool {t.name}", t.latency) for t in report.tools if t.latency is not None]
    ks = sorted({k for p in report.pass_at_k for k in p.at_k})
    rewards = [(f"version {g.key}", g) for g in report.reward_by_version]
    rewards += [(f"data source {g.key}", g) for g in report.reward_by_source]
    return environment.from_string(source).render(
        run_name=report.run_dir.rstrip("/").rsplit("/", 1)[-1], run_dir=report.run_dir,
        made_at=dt.datetime.fromtimestamp(report.made_at, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        shards_read=report.shards_read, event_files=report.event_files, events=report.events,
        workers=len(report.workers), since=_duration(report.since_s) if report.since_s else None,
        skipped=report.skipped, summary=summary_pairs(report), latency=latency, figures=figures,
        rewards=rewards, pass_at_k=report.pass_at_k, ks=ks, failures=report.finished.failures,
        examples=report.examples, tools=report.tools, backends=report.backends, down=report.down,
        origin=time_axis(report).origin, worker_rows=report.workers,   # the figures' origin: the first claim
    )


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
