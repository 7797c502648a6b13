"""Shared bits of the benchmarks: a table printer and the final JSON line."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any, Iterable, Sequence

from orchestrator.spool.paths import SpoolPaths
from orchestrator.submission.submit import SubmitReport, submit_rows


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for index, row in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if index == 0:
            print("  " + "  ".join("-" * w for w in widths))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def submit_all(paths: SpoolPaths, rows: Iterable[tuple[int, Any]], **options: Any) -> SubmitReport:
    """submit_rows, stopping the benchmark on a refused row: a benchmark that waits for rows its
    submission refused waits until its timeout (an interpreter without the package's handlers did)."""
    report = submit_rows(paths, rows, **options)
    if report.rejected or report.error:
        first = report.rejected[0] if report.rejected else None
        why = f"line {first.line}: {first.reason}" if first else report.error
        raise SystemExit(f"the benchmark's own submission was refused ({len(report.rejected)} rows), {why}")
    return report


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (0 for one that is gone)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    return total / ticks


def cpu_wait_seconds(pids: list[int]) -> float:
    """Time the threads of these processes spent ready to run but waiting for a CPU, so far
    (schedstat's run delay; 0 for one that is gone, or a kernel without schedstats). Tells CPU
    contention apart from idling: a server slower beside busy neighbours waits here."""
    total = 0
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def median_interval(values: Sequence[float], confidence: float = 0.9, resamples: int = 2000) -> tuple[float, float]:
    """A bootstrap interval of the median (percentile method, fixed seed): how far the median of
    this many noisy pairs may stand from the one a longer run would find."""
    import random

    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return medians[int(tail * resamples)], medians[min(resamples - 1, int((1 - tail) * resamples))]


def emit_json(figures: dict[str, Any]) -> None:
    """The last line of every benchmark: one JSON object with its figures."""
    print(json.dumps(figures, sort_keys=True))


def parse_args(parser: argparse.ArgumentParser, quick: dict[str, Any],
               argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options, plus `--quick`: the tiny size `quick` gives (option dest -> value) for the
    smoke test (tests/test_benchmarks.py); an option given explicitly still wins over it."""
    sizes = " ".join(f"--{dest.replace('_', '-')} {value}" for dest, value in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"a tiny run for the smoke test ({sizes})")
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(**quick)
    return parser.parse_args(argv)
