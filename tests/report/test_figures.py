"""The report's pictures read at a glance: time axes start at the first claim, legends sit
beside the data, and a steady run draws a steady throughput line.

The run is written as a worker would leave it (events, heartbeats, one shard), made up so
the answers are known: submitted 20 s before the first claim, then every 1.5 s a clump of
24 jobs that finish together (16 jobs/s, a saw-tooth for any histogram with narrower bins).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend

from orchestrator.report.figures import DRAWERS
from orchestrator.report.model import RunReport, load_report
from orchestrator.report.time_axis import spread_steps, trailing_rate
from orchestrator.spool.rows import rows_to_table
from orchestrator.spool.shardlog import shard_name
from tests.core.util import make_run

FIRST_CLAIM = 1_700_000_000.0
WAITED_S = 20.0          # submission to the first claim
CLUMPS, CLUMP_JOBS, EVERY_S = 40, 24, 1.5
JOB_S = 1.0              # claim to finish
LAST_FINISH = FIRST_CLAIM + (CLUMPS - 1) * EVERY_S + JOB_S
BACKENDS = ("http://node1:8000/v1", "http://node2:8000/v1")
TIME_AXES = ("timeline.png", "queues.png", "throughput.png", "backends.png")
WITH_LEGENDS = {"timeline.png", "queues.png", "latency.png", "pass_at_k.png", "backends.png"}


@dataclass(frozen=True)
class Job:
    index: int
    worker: str
    start: float


def _jobs() -> list[Job]:
    return [Job(CLUMP_JOBS * clump + i, f"w{i % 2}", FIRST_CLAIM + clump * EVERY_S)
            for clump in range(CLUMPS) for i in range(CLUMP_JOBS)]


def _events(job: Job) -> list[dict]:
    name, s = f"j{job.index}", job.start
    steps = [("init_started", 0.0), ("init_finished", 0.05), ("run_started", 0.05), ("run_finished", 0.95),
             ("eval_started", 0.95), ("eval_finished", JOB_S)]
    found: list[dict] = [{"t": s + at, "job": name, "event": event, "worker": job.worker} for event, at in steps]
    return found + [{"t": s + JOB_S, "job": name, "event": "finished", "worker": job.worker, "status": "ok"}]


def _stamp(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def _row(job: Job) -> dict:
    late = job.index >= CLUMPS * CLUMP_JOBS // 2   # the second half runs on a new checkpoint, on node2
    turn = {"backend": BACKENDS[late], "policy_version": 1 + late, "sent_at": job.start + 0.1, "latency_s": 0.5,
            "output_ids": [1] * 10}
    return {
        "job_id": f"j{job.index}", "group_id": f"g{job.index // 4}", "sample_index": job.index % 4, "group_size": 4,
        "handler": "sleep", "data_source": ("math", "code")[job.index // 4 % 2], "status": "ok",
        "reward": float(job.index % 3 == 0), "sampled_tokens": 10, "turns": [turn],
        "policy_version_min": 1 + late, "policy_version_max": 1 + late,
        "init_s": 0.05, "run_s": 0.9, "eval_s": 0.05, "queue_s": WAITED_S + job.start - FIRST_CLAIM,
        "submitted_at": _stamp(FIRST_CLAIM - WAITED_S), "run_started_at": _stamp(job.start + 0.05),
        "finished_at": _stamp(job.start + JOB_S), "worker": job.worker, "attempt": 1,
    }


def _write_run(root: Path) -> RunReport:
    paths = make_run(root)
    jobs = _jobs()
    for worker in ("w0", "w1"):
        lines = [orjson.dumps(e) for j in jobs if j.worker == worker for e in _events(j)]
        (paths.events / f"{worker}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        heartbeat = {"node": "node1", "state": "running", "started_at": FIRST_CLAIM - 1, "heartbeat_at": LAST_FINISH,
                     "pools": {"init": {"size": 12}, "run": {"size": 12}, "eval": {"size": 12}}}
        (paths.workers / f"{worker}.json").write_bytes(orjson.dumps(heartbeat))
    pq.write_table(rows_to_table([_row(j) for j in jobs]), paths.shards / shard_name("w0", 1))
    return load_report(paths, now=LAST_FINISH + 1)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> RunReport:
    made = _write_run(tmp_path_factory.mktemp("figures") / "run")
    assert made.window == pytest.approx((FIRST_CLAIM - WAITED_S, LAST_FINISH))   # the wait is in the data
    return made


def _drawn(report: RunReport, name: str) -> Figure:
    figure, _ = DRAWERS[name][1](report)
    FigureCanvasAgg(figure).draw()   # legends are placed when drawn
    return figure


def _time_axes(figure: Figure) -> list[Axes]:
    return [axes for axes in figure.axes if axes.get_xlabel().startswith("seconds since")]


@pytest.mark.parametrize("name", TIME_AXES)
def test_time_axes_start_at_the_first_claim_and_say_when_it_was_submitted(report: RunReport, name: str) -> None:
    figure = _drawn(report, name)
    (axes,) = _time_axes(figure)
    assert axes.get_xlim() == pytest.approx((0.0, LAST_FINISH - FIRST_CLAIM))
    assert "first claim" in axes.get_xlabel() and f"submitted {WAITED_S:.1f} s before" in axes.get_xlabel()


def test_a_steady_run_draws_a_steady_throughput_line(report: RunReport) -> None:
    figure = _drawn(report, "throughput.png")
    jobs, tokens = (axes.get_lines()[0] for axes in figure.axes)
    x, per_s = (np.asarray(v, float) for v in jobs.get_data())
    middle = (x > 0.25 * x[-1]) & (x < 0.75 * x[-1])
    assert middle.sum() > 50
    steady = CLUMP_JOBS / EVERY_S
    assert per_s[middle].min() > 0 and per_s[middle].max() / per_s[middle].min() < 1.5, per_s[middle]
    assert per_s[middle].mean() == pytest.approx(steady, rel=0.1)
    # Tokens reach the figure only as the report's 60 bins (1.3 s here, near the 1.5 s clumps):
    # their level is right, their steadiness is limited by those bins.
    token_rate = np.asarray(tokens.get_ydata(), float)
    assert token_rate[middle].mean() == pytest.approx(10 * steady, rel=0.15)   # 10 tokens a job


def test_a_stall_longer_than_the_window_drops_the_rate_to_zero() -> None:
    finishes = np.concatenate([np.arange(0.0, 10.0, 0.5), np.arange(30.0, 40.0, 0.5)])
    grid = np.linspace(0.0, 40.0, 401)
    rate = trailing_rate(*spread_steps(finishes, np.arange(1.0, len(finishes) + 1), longest=2.0), grid, 2.0, 0.0)
    assert np.allclose(rate[(grid > 13) & (grid < 27)], 0.0)
    assert np.allclose(rate[(grid > 3) & (grid < 9)], 2.0) and np.allclose(rate[(grid > 33) & (grid < 39)], 2.0)


def _legends(figure: Figure) -> list[Legend]:
    found = [axes.get_legend() for axes in figure.axes if axes.get_legend() is not None]
    return [*figure.legends, *found]


@pytest.mark.parametrize("name", sorted(DRAWERS))
def test_legends_sit_beside_the_data_inside_the_picture(report: RunReport, name: str) -> None:
    figure = _drawn(report, name)
    legends = _legends(figure)
    assert bool(legends) == (name in WITH_LEGENDS)
    renderer = figure.canvas.get_renderer()
    picture = figure.bbox
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert picture.x0 <= box.x0 and box.x1 <= picture.x1 and picture.y0 <= box.y0 and box.y1 <= picture.y1
        for axes in figure.axes:
            if axes.get_visible():
                assert not box.overlaps(axes.get_window_extent(renderer)), (name, axes.get_title(), axes.get_ylabel())


def test_the_page_times_backend_outages_from_the_first_claim_as_its_figures_do(report: RunReport) -> None:
    from dataclasses import replace

    from orchestrator.report.figures import FigureFile
    from orchestrator.report.llm_stats import DownPeriod
    from orchestrator.report.page import render_page

    outage = DownPeriod("http://b1:8000/v1", FIRST_CLAIM + 12.0, FIRST_CLAIM + 15.5, "connection refused")
    page = render_page(replace(report, down=[outage]), [FigureFile("backends.png", "backends", "")])
    assert "<td>12.0</td><td>15.5</td>" in page, "the outage is timed from the first claim, as on backends.png"
