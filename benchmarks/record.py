"""The performance record (benchmarks/record.json) and how a figure is judged against it.

The record holds the headline figures of the last release, each with its unit, direction, goal,
the command and size that measured it, when, and how busy the machine was then. A new run is
compared figure by figure:

- ratio = how many times worse than the record (this / record where lower is better, record /
  this where higher is better), so > 1 is worse whichever way the figure points;
- worse by more than REGRESSION_FACTOR (and by more than the figure's noise) is a regression when
  the machine was quiet while the figure was measured, and only a warning when it was not: the
  same code measures 2-10x apart on these shared machines when neighbours take the cores;
- quiet: others used less than QUIET_SHARE of the CPUs (benchmarks/machine.py says why this and
  not the load average). A CPU-bound benchmark that others leave 3/4 of the machine runs at most
  1/(1 - 0.25) = 1.33x slower, inside the 1.5x a regression needs.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.headlines import Direction, Figure

RECORD_PATH = Path(__file__).resolve().parent / "record.json"
REGRESSION_FACTOR = 1.5
QUIET_SHARE = 0.25   # of the CPUs, used by others on average while the benchmark ran


class Verdict(str, enum.Enum):
    OK = "ok"
    BETTER = "better"                  # beyond the factor the other way: worth a new record
    REGRESSION = "REGRESSION"          # worse beyond the factor, on a quiet machine: fails the run
    UNTRUSTED = "worse, machine busy"  # the same on a busy machine: a warning
    NO_RECORD = "no record"
    NOT_COMPARED = "not compared"      # a figure too unstable to judge (headlines.py says why)
    PRODUCED = "produced"              # --quick: the figure is there, nothing compared
    MISSING = "MISSING"                # the benchmark ran but did not print the figure
    FAILED = "FAILED"
    SKIPPED = "skipped"


FAILING = frozenset({Verdict.REGRESSION, Verdict.MISSING, Verdict.FAILED})


@dataclass(frozen=True)
class Entry:
    """One recorded figure, with everything needed to read it without the code."""

    benchmark: str
    figure: str
    value: float
    unit: str
    direction: str
    goal: float | None
    command: str
    size: str
    date: str
    load_1min: float | None
    others_cores: float | None
    seconds: float

    @property
    def key(self) -> str:
        return f"{self.benchmark}.{self.figure}"


@dataclass
class Record:
    release: str = ""
    commit: str = ""
    written: str = ""
    cpus: int = 0
    entries: dict[str, Entry] = field(default_factory=dict)
    not_recorded: dict[str, str] = field(default_factory=dict)   # benchmark -> why it has no figures

    def entry(self, benchmark: str, figure: str) -> Entry | None:
        return self.entries.get(f"{benchmark}.{figure}")


def load(path: Path = RECORD_PATH) -> Record:
    """The record at `path`; an empty one when there is none yet."""
    if not path.is_file():
        return Record()
    data = json.loads(path.read_text())
    entries = {f"{e['benchmark']}.{e['figure']}": Entry(**e) for e in data.get("figures", [])}
    return Record(release=data.get("release", ""), commit=data.get("commit", ""), written=data.get("written", ""),
                  cpus=data.get("cpus", 0), entries=entries, not_recorded=dict(data.get("not_recorded", {})))


def save(record: Record, path: Path = RECORD_PATH) -> None:
    data = {
        "about": "Headline figures of the last release: python -m benchmarks compares a run with them, "
                 "python -m benchmarks --write-record rewrites them (benchmarks/record.py).",
        "regression_factor": REGRESSION_FACTOR, "quiet_share_of_cpus": QUIET_SHARE,
        "release": record.release, "commit": record.commit, "written": record.written, "cpus": record.cpus,
        "figures": [asdict(record.entries[key]) for key in sorted(record.entries)],
        "not_recorded": dict(sorted(record.not_recorded.items())),
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


def worse_ratio(direction: Direction, value: float, recorded: float) -> float | None:
    """How many times worse `value` is than `recorded` (> 1: worse); None when no ratio means
    anything (a record at or below zero)."""
    if recorded < 0 or (recorded == 0 and direction is Direction.HIGHER):
        return None
    if direction is Direction.LOWER:
        if recorded == 0:
            return 1.0 if value <= 0 else math.inf
        return value / recorded
    return recorded / value if value > 0 else math.inf


def is_quiet(others_cores: float | None, cpus: int) -> bool:
    """Quiet enough for a comparison to fail a run; unknown counts as busy (never a false alarm)."""
    return others_cores is not None and others_cores < QUIET_SHARE * cpus


def judge(figure: Figure, value: float, entry: Entry | None, quiet: bool) -> tuple[float | None, Verdict]:
    """The ratio to the record and the verdict for one figure of a full-size run."""
    if entry is None:
        return None, Verdict.NO_RECORD
    ratio = worse_ratio(figure.direction, value, entry.value)
    if not figure.compare:
        return ratio, Verdict.NOT_COMPARED
    if ratio is None or abs(value - entry.value) <= figure.noise:
        return ratio, Verdict.OK
    if ratio > REGRESSION_FACTOR:
        return ratio, Verdict.REGRESSION if quiet else Verdict.UNTRUSTED
    if ratio < 1 / REGRESSION_FACTOR:
        return ratio, Verdict.BETTER
    return ratio, Verdict.OK


def number(value: Any) -> float | None:
    """A figure's value as a number (NaN included: the benchmark could not compute it at this size);
    None for null, text or a boolean."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
