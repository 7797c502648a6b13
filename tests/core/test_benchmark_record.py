"""The performance record: `python -m benchmarks` judges each headline figure against
benchmarks/record.json (a figure 1.5x worse on a quiet machine fails the run, on a busy one it
warns), README's benchmark table is the one the record makes, and `--quick` runs benchmarks
end to end and lists each in its table."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import readme
from benchmarks.headlines import BY_NAME, CATALOGUE, Benchmark, Direction, Figure, discovered
from benchmarks.record import Entry, Record, Verdict, is_quiet, judge, load, save, worse_ratio
from benchmarks.runner import Outcome, Status, last_json, run_all
from benchmarks.table import exit_status, rows_for

REPO = Path(__file__).resolve().parents[2]
CPUS = 2
QUIET, BUSY = 0.1, 1.5   # cores others used: under a quarter of 2 CPUs, and well over
FAKE = Benchmark("fake", "a synthetic benchmark", (
    Figure("latency_ms", "ms", Direction.LOWER, goal=10.0),
    Figure("speedup", "x", Direction.HIGHER, goal=2.0),
    Figure("share", "share", Direction.LOWER, noise=0.05),
), ("--size", "3"))


def entry(figure: str, value: float) -> Entry:
    spec = next(f for f in FAKE.figures if f.key == figure)
    return Entry("fake", figure, value, spec.unit, spec.direction.value, spec.goal, "python -m benchmarks.fake --size 3",
                 "--size 3", "2026-01-01 00:00 UTC", 0.5, 0.1, 12.0)


RECORD = Record(release="0.1.0", commit="abc1234", written="2026-01-01 00:00 UTC", cpus=CPUS, entries={
    e.key: e for e in (entry("latency_ms", 4.0), entry("speedup", 8.0), entry("share", 0.01))})


def outcome(others: float | None, **figures: float) -> Outcome:
    return Outcome("fake", Status.RAN, "python -m benchmarks.fake --size 3", figures=dict(figures), seconds=12.0,
                   load_1min=0.4, others_cores=others)


def verdicts(others: float | None, quick: bool = False, **figures: float) -> tuple[dict[str, Verdict], int]:
    rows = rows_for(FAKE, outcome(others, **figures), RECORD, quick, CPUS)
    return {row.figure: row.verdict for row in rows}, exit_status(rows)


def test_a_figure_twice_as_bad_on_a_quiet_machine_is_a_regression_and_fails_the_run() -> None:
    found, status = verdicts(QUIET, latency_ms=8.0, speedup=8.0, share=0.01)
    assert found["latency_ms"] is Verdict.REGRESSION and status == 1
    assert found["speedup"] is Verdict.OK and found["share"] is Verdict.OK


def test_the_same_on_a_busy_machine_only_warns() -> None:
    found, status = verdicts(BUSY, latency_ms=8.0, speedup=8.0, share=0.01)
    assert found["latency_ms"] is Verdict.UNTRUSTED and status == 0
    unknown, status = verdicts(None, latency_ms=8.0, speedup=8.0, share=0.01)   # load not measurable: busy
    assert unknown["latency_ms"] is Verdict.UNTRUSTED and status == 0


def test_better_figures_pass_whichever_way_they_point() -> None:
    found, status = verdicts(QUIET, latency_ms=1.0, speedup=40.0, share=0.0)
    assert found == {"latency_ms": Verdict.BETTER, "speedup": Verdict.BETTER, "share": Verdict.OK} and status == 0
    slightly_worse, status = verdicts(QUIET, latency_ms=5.5, speedup=6.0, share=0.01)   # within 1.5x
    assert set(slightly_worse.values()) == {Verdict.OK} and status == 0


def test_direction_is_respected() -> None:
    # a higher-is-better figure halved is 2x worse; a lower-is-better figure halved is better
    found, status = verdicts(QUIET, latency_ms=2.0, speedup=4.0, share=0.01)
    assert found["speedup"] is Verdict.REGRESSION and found["latency_ms"] is Verdict.BETTER and status == 1
    assert worse_ratio(Direction.HIGHER, 4.0, 8.0) == 2.0 and worse_ratio(Direction.LOWER, 8.0, 4.0) == 2.0
    assert worse_ratio(Direction.LOWER, 2.0, 4.0) == 0.5 and worse_ratio(Direction.HIGHER, 16.0, 8.0) == 0.5


def test_a_figure_within_its_noise_is_never_worse_and_zero_records_compare() -> None:
    found, _ = verdicts(QUIET, latency_ms=4.0, speedup=8.0, share=0.05)   # 5x, but 0.04 apart
    assert found["share"] is Verdict.OK
    assert worse_ratio(Direction.LOWER, 0.0, 0.0) == 1.0 and worse_ratio(Direction.LOWER, 1.0, 0.0) == math.inf
    assert worse_ratio(Direction.HIGHER, 0.0, 8.0) == math.inf and worse_ratio(Direction.HIGHER, 1.0, 0.0) is None
    unstable = Figure("latency_ms", "ms", Direction.LOWER, compare=False)
    assert judge(unstable, 40.0, RECORD.entries["fake.latency_ms"], True) == (10.0, Verdict.NOT_COMPARED)
    failed = Figure("failed", "requests", Direction.LOWER, goal=0.0)
    assert judge(failed, 3.0, Entry("f", "failed", 0.0, "", "lower", 0.0, "", "", "", None, None, 1.0), True)[1] \
        is Verdict.REGRESSION


def test_a_goal_not_met_is_shown_apart_from_the_record() -> None:
    rows = rows_for(FAKE, outcome(QUIET, latency_ms=12.0, speedup=8.0, share=0.01), RECORD, False, CPUS)
    by_figure = {row.figure: row for row in rows}
    assert by_figure["latency_ms"].goal_met is False and by_figure["latency_ms"].verdict is Verdict.REGRESSION
    assert by_figure["speedup"].goal_met is True and by_figure["share"].goal_met is None
    near = rows_for(FAKE, outcome(QUIET, latency_ms=5.0, speedup=1.0, share=0.01), RECORD, False, CPUS)
    assert [(r.figure, r.goal_met) for r in near if r.goal_met is False] == [("speedup", False)]


def test_a_figure_recorded_at_another_size_is_not_compared() -> None:
    other = Record(entries={k: Entry(**{**e.__dict__, "size": "--size 9"}) for k, e in RECORD.entries.items()})
    rows = rows_for(FAKE, outcome(QUIET, latency_ms=40.0, speedup=8.0, share=0.01), other, False, CPUS)
    assert {r.verdict for r in rows} == {Verdict.NO_RECORD} and exit_status(rows) == 0
    assert "another size (--size 9)" in rows[0].note and rows[0].recorded is None


def test_quick_compares_nothing_but_needs_every_figure() -> None:
    found, status = verdicts(QUIET, quick=True, latency_ms=400.0, speedup=0.1, share=0.9)
    assert set(found.values()) == {Verdict.PRODUCED} and status == 0
    missing, status = verdicts(QUIET, quick=True, latency_ms=1.0, speedup=8.0)
    assert missing["share"] is Verdict.MISSING and status == 1
    assert all(r.ratio is None and r.recorded is None and r.goal_met is None
               for r in rows_for(FAKE, outcome(QUIET, latency_ms=1.0, speedup=8.0, share=0.0), RECORD, True, CPUS))


def test_a_failed_benchmark_fails_the_run_and_a_skipped_one_does_not() -> None:
    failed = Outcome("fake", Status.FAILED, "python -m benchmarks.fake", reason="exit 1: boom")
    rows = rows_for(FAKE, failed, RECORD, False, CPUS)
    assert [r.verdict for r in rows] == [Verdict.FAILED] and "boom" in rows[0].note and exit_status(rows) == 1
    skipped = Outcome("fake", Status.SKIPPED, "python -m benchmarks.fake", reason="needs slurm")
    assert exit_status(rows_for(FAKE, skipped, RECORD, False, CPUS)) == 0
    nan, status = verdicts(QUIET, latency_ms=float("nan"), speedup=8.0, share=0.01)
    assert nan["latency_ms"] is Verdict.MISSING and status == 1


def test_quiet_means_others_used_under_a_quarter_of_the_cpus() -> None:
    assert is_quiet(0.4, 2) and not is_quiet(0.6, 2) and not is_quiet(None, 2)


def test_the_record_round_trips(tmp_path: Path) -> None:
    save(RECORD, tmp_path / "record.json")
    assert load(tmp_path / "record.json") == RECORD
    assert load(tmp_path / "none.json") == Record()


def test_a_benchmark_that_fails_is_reported_and_the_others_still_run(tmp_path: Path) -> None:
    absent = Benchmark("no_such_benchmark", "", (Figure("x", "x", Direction.LOWER),), quick_args=())
    silent = Benchmark("common", "", (Figure("x", "x", Direction.LOWER),), quick_args=())   # prints no JSON line
    outcomes = run_all([absent, silent], quick=True, logs=tmp_path)
    assert [(o.name, o.status) for o in outcomes] == [("no_such_benchmark", Status.FAILED), ("common", Status.FAILED)]
    assert "No module named benchmarks.no_such_benchmark" in outcomes[0].reason
    assert outcomes[1].reason == "its last line is not a JSON object"


def test_the_last_json_line_is_read_and_anything_else_is_not() -> None:
    assert last_json('table\n{"a": 1}\n\n') == {"a": 1}
    assert last_json("table\nnot json") is None and last_json("[1]") is None and last_json("") is None


def test_every_benchmark_has_headline_figures() -> None:
    assert sorted(BY_NAME) == sorted(discovered()), (
        "every program in benchmarks/ needs its headline figures in benchmarks/headlines.py CATALOGUE")


def test_the_record_agrees_with_the_catalogue() -> None:
    record = load()
    assert record.entries, "benchmarks/record.json holds no figure: run python -m benchmarks --write-record"
    for entry_ in record.entries.values():
        figure = next((f for f in BY_NAME[entry_.benchmark].figures if f.key == entry_.figure), None)
        assert figure is not None, f"{entry_.key} is in the record but no longer a headline figure"
        assert (entry_.unit, entry_.direction, entry_.goal) == (figure.unit, figure.direction.value, figure.goal), (
            f"{entry_.key}: the record's unit, direction or goal differ from benchmarks/headlines.py: take a new record")
        assert entry_.size == BY_NAME[entry_.benchmark].size(), (
            f"{entry_.key} was recorded at another size than benchmarks/headlines.py runs: take a new record")
    for benchmark in CATALOGUE:
        recorded = all(record.entry(benchmark.name, f.key) for f in benchmark.figures)
        assert recorded or benchmark.name in record.not_recorded, f"{benchmark.name} has no figures in the record"


def test_readme_table_is_the_one_the_record_makes() -> None:
    text = (REPO / "README.md").read_text()
    assert readme.current_block(text) == readme.block(load()), (
        "README.md's benchmark table differs from benchmarks/record.json: run python -m benchmarks --readme")


def test_readme_rewrite_touches_only_the_text_between_the_markers() -> None:
    text = f"intro\n{readme.START}\nold table\n{readme.END}\nrest\n"
    new = readme.rewritten(text, RECORD)
    assert new.startswith(f"intro\n{readme.START}\n| benchmark |") and new.endswith(f"\n{readme.END}\nrest\n")
    assert readme.rewritten(new, RECORD) == new
    with pytest.raises(readme.MarkersMissing, match="markers"):
        readme.rewritten("no markers here", RECORD)


def table_benchmarks(stdout: str) -> set[str]:
    """The benchmark column of the printed table (rich box drawing: a row starts with '│ ')."""
    return {line.split("│")[1].strip() for line in stdout.splitlines() if line.startswith("│")} - {""}


@pytest.mark.timeout(300)
def test_quick_runs_benchmarks_end_to_end_and_lists_each() -> None:
    # Two cheap benchmarks through the runner, the table and the exit status: every benchmark runs at
    # its --quick size in tests/test_benchmarks.py already (all of them here again took 201 s of CI).
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "cli_startup,routing"], cwd=REPO,
                          capture_output=True, text=True, timeout=280)
    seconds = time.monotonic() - started
    output = f"--- stdout ---\n{done.stdout[-8000:]}\n--- stderr ---\n{done.stderr[-4000:]}"
    assert table_benchmarks(done.stdout) == {"cli_startup", "routing"}, output
    assert "nothing was compared with the record" in done.stderr, output
    assert done.returncode == 0, f"python -m benchmarks --quick exited {done.returncode} after {seconds:.0f} s\n{output}"
    print(f"python -m benchmarks --quick: {seconds:.0f} s")
