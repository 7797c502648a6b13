"""`hpc-rollout report`: read the spool, draw the figures, write report.html, numbers.json and
inspect files of example jobs into RUN/report/ (each written to a temporary name, then renamed)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.spool import fsops
from orchestrator.report.inspect_job import inspect_job
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shard_reader import READ_ERRORS, read_shard_table
from orchestrator.report.event_read import events_of_jobs
from orchestrator.report.figures import draw_all
from orchestrator.report.model import RunReport, load_report
from orchestrator.report.page import render_page
from orchestrator.report.summary import numbers, summary_text
from orchestrator.errors import HpcRolloutError

PAGE = "report.html"
JOBS_DIR = "jobs"


@dataclass(frozen=True)
class ReportFiles:
    page: Path
    figures: tuple[Path, ...]
    numbers: Path
    text: str
    report: RunReport


def make_report(paths: SpoolPaths, out_dir: Path | None = None, since_s: float | None = None,
                pass_reward: float = 1.0) -> ReportFiles:
    out = out_dir or paths.root / "report"
    _own_directory(out, paths)
    _own_directory(out / JOBS_DIR, paths)
    report = load_report(paths, since_s, pass_reward)
    report = replace(report, examples=_write_examples(paths, out, report))
    figures = draw_all(report, out)
    page = out / PAGE
    _write(page, render_page(report, figures).encode())
    numbers_path = out / "numbers.json"
    _write(numbers_path, orjson.dumps(numbers(report), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return ReportFiles(page, tuple(out / f.name for f in figures), numbers_path, summary_text(report, str(page)), report)


def _write(path: Path, data: bytes) -> None:
    """Written new, then renamed over: a link planted at `path` is replaced, its target untouched."""
    fsops.write_atomic(path, data, durability=fsops.Durability.NONE)


class ReportError(HpcRolloutError, ValueError):
    """The report cannot be written where it should go (the message says why and what to do)."""


def _own_directory(directory: Path, paths: SpoolPaths) -> None:
    """Make `directory` if needed; refuse one that is a symbolic link (files would land where it points)."""
    if directory.is_symlink():
        shown = directory.relative_to(paths.root) if directory.is_relative_to(paths.root) else directory
        raise ReportError(f"{shown} is a symbolic link (to {os.readlink(directory)}): the report writes no file "
                          f"through a link; remove it (`rm {directory}`) and run the report again")
    fsops.create_dirs(directory)


def _write_examples(paths: SpoolPaths, out: Path, report: RunReport) -> dict[str, str]:
    """`inspect --json` of the example jobs of each failure kind, linked from the page."""
    if not report.example_shards:
        return {}
    rows = _rows_of(report.example_shards)
    events = events_of_jobs(paths, list(report.example_shards))
    written = {}
    for job in sorted(report.example_shards):
        try:
            found = inspect_job(paths, job, row=rows.get(job), events=events.get(job, []))
        except (LookupError, ValueError):
            continue
        name = f"{JOBS_DIR}/{job}.json"
        _write(out / name, orjson.dumps(found, default=_plain, option=orjson.OPT_INDENT_2))
        written[job] = name
    return written


def _rows_of(shard_of: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Full rows of a few jobs, each shard read once."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(set(shard_of.values())):
        wanted = pa.array([job for job, shard in shard_of.items() if shard == path], pa.string())
        try:
            table = read_shard_table(path)
        except READ_ERRORS:
            continue  # already named in the report's skipped list
        for row in table.filter(pc.is_in(table.column("job_id"), value_set=wanted)).to_pylist():
            found[row["job_id"]] = row
    return found


def _plain(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError
