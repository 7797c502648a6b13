"""The one table a run of every benchmark prints: each headline figure beside its goal and its record.

Rows are made from the outcomes and the record first (`rows_for`, plain data the tests check),
then drawn with rich (`render`): a regression and a failure in red, a comparison a busy machine
makes untrustworthy in yellow, a missed goal in red in the goal column, apart from the comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from benchmarks.headlines import Benchmark
from benchmarks.record import FAILING, Record, Verdict, is_quiet, judge, number
from benchmarks.runner import Outcome, Status
from orchestrator.cli.console import Tone, styled

TONES = {Verdict.REGRESSION: Tone.ERROR, Verdict.MISSING: Tone.ERROR, Verdict.FAILED: Tone.ERROR,
         Verdict.UNTRUSTED: Tone.WARNING, Verdict.OK: Tone.GOOD, Verdict.BETTER: Tone.GOOD, Verdict.PRODUCED: Tone.GOOD}


@dataclass(frozen=True)
class Row:
    benchmark: str
    figure: str
    goal: str
    goal_met: bool | None   # None: no goal, or not judged (--quick, no figure)
    value: float | None
    unit: str
    recorded: float | None
    ratio: float | None     # times worse than the record (> 1: worse)
    verdict: Verdict
    note: str = ""
    machine: str = ""


def machine_text(outcome: Outcome) -> str:
    load = "-" if outcome.load_1min is None else f"{outcome.load_1min:.1f}"
    others = "-" if outcome.others_cores is None else f"{outcome.others_cores:.2f}"
    return f"{load} / {others}"


def figure_rows(benchmark: Benchmark, outcome: Outcome, record: Record, quick: bool, cpus: int) -> list[Row]:
    rows = []
    quiet = is_quiet(outcome.others_cores, cpus)
    for figure in benchmark.figures:
        key = (figure.quick_key or figure.key) if quick else figure.key
        value = number(outcome.figures.get(key))
        entry = record.entry(benchmark.name, figure.key)
        ratio, met, note = None, None, ""
        if entry is not None and entry.size != benchmark.size():   # figures of two sizes do not compare
            note = f"recorded at another size ({entry.size})"
            entry = None
        recorded = None if entry is None or quick else entry.value
        if value is None:
            verdict, note = Verdict.MISSING, "not in its JSON line"
        elif quick:   # NaN included: the tiny size may leave a figure undefined (no slow prompt trained)
            verdict, note = Verdict.PRODUCED, ""
        elif math.isnan(value):
            verdict, note = Verdict.MISSING, "not a number"
        else:
            ratio, verdict = judge(figure, value, entry, quiet)
            met = figure.meets_goal(value)
        rows.append(Row(benchmark.name, key, figure.goal_text(), met, value, figure.unit, recorded, ratio, verdict, note))
    return rows


def rows_for(benchmark: Benchmark, outcome: Outcome, record: Record, quick: bool, cpus: int) -> list[Row]:
    """The rows of one benchmark: one per headline figure, or one saying why there are none."""
    if outcome.status is not Status.RAN:
        verdict = Verdict.SKIPPED if outcome.status is Status.SKIPPED else Verdict.FAILED
        names = ", ".join(f.key for f in benchmark.figures)
        return [Row(benchmark.name, names, "-", None, None, "", None, None, verdict, note=outcome.reason)]
    rows = figure_rows(benchmark, outcome, record, quick, cpus)
    rows[0] = replace(rows[0], machine=machine_text(outcome))
    return rows


def exit_status(rows: Sequence[Row]) -> int:
    """1 when a figure regressed on a quiet machine, a benchmark failed or a headline is missing."""
    return 1 if any(row.verdict in FAILING for row in rows) else 0


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value) or math.isnan(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) < 1:
        return f"{value:.3g}"
    return f"{value:.{3 if abs(value) < 10 else 2}f}".rstrip("0").rstrip(".")


def with_unit(value: float | None, unit: str) -> str:
    """`2.5x`, `0.03` (a share), `12.4 ms`."""
    if value is None:
        return "-"
    if unit == "x":
        return f"{fmt(value)}x"
    return fmt(value) if unit in ("", "share") else f"{fmt(value)} {unit}"


def goal_cell(row: Row) -> Text:
    if row.goal_met is False:
        return styled(f"{row.goal} missed", Tone.ERROR)
    if row.goal_met:
        return styled(f"{row.goal} met", Tone.GOOD)
    return Text(row.goal)


def verdict_cell(row: Row) -> Text:
    text = row.verdict.value + (f": {row.note}" if row.note else "")
    tone = TONES.get(row.verdict)
    return styled(text, tone) if tone else Text(text)


def render(console: Console, rows: Sequence[Row], title: str) -> None:
    table = Table(title=title, title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("benchmark", "left"), ("figure", "left"), ("goal", "left"), ("this run", "right"), ("record", "right"),
        ("this/record (>1 worse)", "right"), ("verdict", "left"), ("load 1m / others' cores", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify)
    previous = ""
    for row in rows:
        value = with_unit(row.value, row.unit)
        ratio = "-" if row.ratio is None else f"{fmt(row.ratio)}x"
        table.add_row(row.benchmark if row.benchmark != previous else "", row.figure, goal_cell(row), value,
                      fmt(row.recorded), ratio, verdict_cell(row), row.machine)
        previous = row.benchmark
    console.print(table)


def missed_goals(rows: Sequence[Row]) -> list[str]:
    return [f"{row.benchmark}.{row.figure} {fmt(row.value)} (goal {row.goal})" for row in rows if row.goal_met is False]
