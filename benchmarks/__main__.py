"""Every benchmark's headline figures in one table, against their goals and the performance record.

    python -m benchmarks                  # the record's sizes, one at a time (about 10 minutes on 2 cores)
    python -m benchmarks --quick          # each at its tiny --quick size: only checks that the figures come out
    python -m benchmarks --write-record   # run, then make this run the record (and README's table)
    python -m benchmarks --readme         # rewrite README's benchmark table from the record; runs nothing
    python -m benchmarks --only tail,dapo

Exit status 1 when a figure is more than 1.5x worse than the record on a quiet machine, a benchmark
failed or a headline figure is missing (benchmarks/record.py); 0 otherwise, warnings included.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from benchmarks import machine, readme
from benchmarks.headlines import BY_NAME, CATALOGUE, Benchmark, discovered
from benchmarks.record import QUIET_SHARE, RECORD_PATH, Entry, Record, Verdict, load, number, save
from benchmarks.runner import REPO, Outcome, Status, run_all
from benchmarks.table import Row, exit_status, fmt, missed_goals, render, rows_for
from orchestrator.cli.console import Tone, make_console, styled, tell

# the runner of the benchmarks, not one (tests/test_benchmarks.py walks benchmarks/ for those)
NOT_A_BENCHMARK = "runs every benchmark's headline figures; tests/core/test_benchmark_record.py runs its --quick"
QUICK_LANES = 4


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="each benchmark at its tiny --quick size; compares nothing")
    parser.add_argument("--write-record", action="store_true", help="make this run the record (and README's table)")
    parser.add_argument("--readme", action="store_true", help="rewrite README's table from the record, run nothing")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (default: all)")
    parser.add_argument("--without", default="", help="requirements to treat as absent, e.g. slurm (comma-separated)")
    parser.add_argument("--record", type=Path, default=RECORD_PATH, help="the record file")
    parser.add_argument("--lanes", type=int, default=None,
                        help=f"benchmarks run at once (default 1; {QUICK_LANES} with --quick, whose figures are not compared)")
    args = parser.parse_args(argv)
    if args.quick and args.write_record:
        parser.error("--write-record takes the record's sizes: tiny --quick figures are no record")
    unknown = [n for n in args.only.split(",") if n and n not in BY_NAME]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; valid: {', '.join(BY_NAME)}")
    return args


def selected(only: str) -> list[Benchmark]:
    names = [n for n in only.split(",") if n]
    return [b for b in CATALOGUE if not names or b.name in names]


def uncatalogued_rows() -> list[Row]:
    """A program in benchmarks/ without headline figures fails the run until it is given some."""
    return [Row(name, "-", "-", None, None, "", None, None, Verdict.MISSING,
                note="no headline figure: add it to benchmarks/headlines.py") for name in discovered() if name not in BY_NAME]


def cost_order(benchmarks: list[Benchmark], record: Record) -> list[Benchmark]:
    """Longest first (by the record's seconds), so that parallel lanes end together."""
    seconds = {b.name: max((e.seconds for e in record.entries.values() if e.benchmark == b.name), default=0.0)
               for b in benchmarks}
    return sorted(benchmarks, key=lambda b: -seconds[b.name])


def progress(outcome: Outcome) -> None:
    others = "-" if outcome.others_cores is None else f"{outcome.others_cores:.2f}"
    cpu = "" if outcome.cpu_s is None else f", {outcome.cpu_s:.0f} CPU s"
    what = f"{outcome.status.value} in {outcome.seconds:.0f} s{cpu}" if outcome.status is not Status.SKIPPED else "skipped"
    load = "-" if outcome.load_1min is None else f"{outcome.load_1min:.1f}"
    tell(f"  {outcome.name}: {what} (load {load}, others' cores {others})",
         f" {outcome.reason}" if outcome.reason else "")


def run(args: argparse.Namespace, record: Record) -> tuple[list[Benchmark], list[Outcome], Path]:
    benchmarks = selected(args.only)
    lanes = args.lanes or (QUICK_LANES if args.quick else 1)
    logs = Path(tempfile.mkdtemp(prefix="hpc-rollout-benchmarks-"))
    machine.become_subreaper()
    size = "their tiny --quick sizes" if args.quick else "the record's sizes"
    tell(f"python -m benchmarks: {len(benchmarks)} benchmarks at {size}, {lanes} at a time; "
         f"load average {os.getloadavg()[0]:.1f} on {machine.cpus()} CPUs; outputs in {logs}")
    order = cost_order(benchmarks, record) if lanes > 1 else benchmarks
    without = frozenset(r for r in args.without.split(",") if r)
    outcomes = {o.name: o for o in run_all(order, args.quick, logs, lanes, progress, without)}
    return benchmarks, [outcomes[b.name] for b in benchmarks], logs


def summary(rows: Sequence[Row], quick: bool, logs: Path, cpus: int) -> None:
    if quick:
        tell("--quick: tiny sizes are not comparable, so nothing was compared with the record; "
             "each headline figure was only checked to be produced.")
    else:
        tell(f"quiet machine: others used < {QUIET_SHARE * cpus:g} of {cpus} CPUs while the benchmark ran "
             f"(only then does a figure > 1.5x worse than the record fail the run)")
    for row in rows:
        name = f"{row.benchmark}.{row.figure}"
        if row.verdict is Verdict.REGRESSION:
            tell(styled("regression:", Tone.ERROR), f" {name} {fmt(row.ratio)}x worse than the record on a quiet machine")
        elif row.verdict is Verdict.UNTRUSTED:
            tell(styled("warning:", Tone.WARNING), f" {name} {fmt(row.ratio)}x worse than the record, but others "
                 "were using the CPUs meanwhile: not trusted; run it again on a quiet machine")
        elif row.verdict in (Verdict.FAILED, Verdict.MISSING):
            tell(styled(f"{row.verdict.value.lower()}:", Tone.ERROR), f" {row.benchmark}: {row.note or row.figure}")
    goals = missed_goals(rows)
    if goals:
        tell(styled("goals missed:", Tone.ERROR), " " + "; ".join(goals))
    tell(f"outputs of each benchmark: {logs}")


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def recorded(record: Record, benchmarks: Sequence[Benchmark], outcomes: Sequence[Outcome]) -> Record:
    """The record with this run's figures in it; a benchmark that failed or was skipped keeps its old
    figures (or says why it has none)."""
    from orchestrator import __version__

    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    headlines = {f"{b.name}.{f.key}" for b in CATALOGUE for f in b.figures}   # a figure no longer one is dropped
    entries = {key: entry for key, entry in record.entries.items() if key in headlines}
    not_recorded = {name: why for name, why in record.not_recorded.items() if name in BY_NAME}
    for benchmark, outcome in zip(benchmarks, outcomes):
        values = {f.key: value for f in benchmark.figures
                  if (value := number(outcome.figures.get(f.key))) is not None and not math.isnan(value)}
        if outcome.status is Status.RAN and len(values) == len(benchmark.figures):
            not_recorded.pop(benchmark.name, None)
            for figure in benchmark.figures:
                entry = Entry(benchmark.name, figure.key, values[figure.key], figure.unit, figure.direction.value,
                              figure.goal, outcome.command, benchmark.size(), now, rounded(outcome.load_1min),
                              rounded(outcome.others_cores), round(outcome.seconds, 1))
                entries[entry.key] = entry
        elif not any(e.benchmark == benchmark.name for e in entries.values()):
            not_recorded[benchmark.name] = outcome.reason or "its figures were missing"
    return replace(record, release=__version__, commit=git_commit(), written=now, cpus=machine.cpus(),
                   entries=entries, not_recorded=not_recorded)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    record = load(args.record)
    if args.readme:
        changed = readme.rewrite(record)
        tell(f"README.md's benchmark table {'rewritten from' if changed else 'already matches'} the record ({args.record})")
        return 0
    benchmarks, outcomes, logs = run(args, record)
    rows = [row for b, o in zip(benchmarks, outcomes) for row in rows_for(b, o, record, args.quick, machine.cpus())]
    if not args.only:
        rows += uncatalogued_rows()
    size = "--quick sizes: figures only checked to be produced" if args.quick else "record sizes, compared with the record"
    render(make_console(), rows, f"benchmarks, headline figures ({size})")
    summary(rows, args.quick, logs, machine.cpus())
    if args.write_record:
        save(recorded(record, benchmarks, outcomes), args.record)
        readme.rewrite(load(args.record))
        tell(f"record written: {args.record}; README.md's table rewritten from it")
        return 1 if any(o.status is Status.FAILED for o in outcomes) else 0
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
