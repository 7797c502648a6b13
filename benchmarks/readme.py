"""README.md's benchmark table, made from the record: `python -m benchmarks --readme` writes it
between two marker comments, and tests/core/test_benchmark_record.py checks that the README holds
exactly what the record makes, so the two never drift apart.

What each benchmark measures comes from benchmarks/headlines.py; the figures, their goals and the
sizes they were taken at come from benchmarks/record.json.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.headlines import CATALOGUE, DEFAULTS, Benchmark
from benchmarks.record import QUIET_SHARE, REGRESSION_FACTOR, Entry, Record
from benchmarks.table import with_unit

README = Path(__file__).resolve().parents[1] / "README.md"
START = ("<!-- benchmark table: made from benchmarks/record.json by `python -m benchmarks --readme` "
         "(what each measures: benchmarks/headlines.py); do not edit by hand -->")
END = "<!-- end of the benchmark table -->"


class MarkersMissing(ValueError):
    pass


def goal_suffix(entry: Entry) -> str:
    if entry.goal is None:
        return ""
    return f" ({'<=' if entry.direction == 'lower' else '>='} {entry.goal:,g})"


def headline_cell(benchmark: Benchmark, record: Record) -> str:
    parts = []
    for figure in benchmark.figures:
        entry = record.entry(benchmark.name, figure.key)
        if entry is None:
            parts.append(f"`{figure.key}`{'' if figure.goal is None else ' (' + figure.goal_text() + ')'}")
        else:
            parts.append(f"`{figure.key}` {with_unit(entry.value, entry.unit)}{goal_suffix(entry)}")
    cell = "; ".join(parts)
    why = record.not_recorded.get(benchmark.name)
    return f"{cell}: not recorded, {why}" if why else cell


def size_cell(benchmark: Benchmark, record: Record) -> str:
    entry = next((record.entry(benchmark.name, f.key) for f in benchmark.figures
                  if record.entry(benchmark.name, f.key)), None)
    size = entry.size if entry else benchmark.size()
    return "its defaults" if size == DEFAULTS else f"`{size}`"


def footer(record: Record) -> str:
    loads = [e.load_1min for e in record.entries.values() if e.load_1min is not None]
    others = [e.others_cores for e in record.entries.values() if e.others_cores is not None]
    load = (f"1-minute load average {min(loads):.1f}-{max(loads):.1f} before each benchmark (its own runs included), "
            f"other people's work using {min(others):.2f}-{max(others):.2f} cores while they ran"
            if loads and others else "load not noted")
    return (f"`python -m benchmarks` runs every headline figure above at the size shown (about 10 minutes on 2 "
            f"cores) and prints one table: each figure beside its goal and this record (benchmarks/record.json, "
            f"release {record.release or '-'}, taken {record.written or '-'} at commit {record.commit or '-'}, "
            f"{record.cpus or '?'} CPUs, {load}). A figure more than {REGRESSION_FACTOR:g}x worse than the record "
            f"fails the run when others used less than {QUIET_SHARE:.0%} of the CPUs while it was measured, and is "
            f"a warning on a busier machine. `--quick` runs each benchmark at its `--quick` size and checks only "
            f"that every figure is produced; `--write-record` takes a new record, `--readme` rewrites this table.")


def block(record: Record) -> str:
    """The text between the markers."""
    lines = ["| benchmark | measures | headline figures of the record (goal) | size |", "|---|---|---|---|"]
    lines += [f"| `{b.name}` | {b.measures} | {headline_cell(b, record)} | {size_cell(b, record)} |" for b in CATALOGUE]
    return "\n".join(lines) + "\n\n" + footer(record)


def current_block(text: str) -> str:
    """What README.md holds between the markers."""
    if START not in text or END not in text:
        raise MarkersMissing(f"README.md has no benchmark table markers: put {START!r} and {END!r} around it")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def rewritten(text: str, record: Record) -> str:
    """`text` (README.md's) with the table between the markers made from `record`."""
    current_block(text)   # the markers are there
    before, rest = text.split(START, 1)
    after = rest.split(END, 1)[1]
    return f"{before}{START}\n{block(record)}\n{END}{after}"


def rewrite(record: Record, path: Path = README) -> bool:
    """Rewrite the README's table; True when it changed."""
    text = path.read_text()
    new = rewritten(text, record)
    if new != text:
        path.write_text(new)
    return new != text
