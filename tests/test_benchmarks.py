"""Benchmarks do not rot: every program in benchmarks/ runs at its tiny `--quick` size and prints
its figures as one JSON object on its last line.

The programs are found by walking benchmarks/: a module with a `__main__` block is a benchmark
(a new one is covered the day it lands), unless it says `NOT_A_BENCHMARK = "why"` (a part of
another benchmark) or `SMOKE_TESTED_IN = "tests/..."` (a test of its own runs its `--quick` size
and checks its figures by name: running it twice would only cost time). A benchmark's `REQUIRES` names what it needs (slurm, bwrap, tmux); without
it the benchmark is skipped with the reason. Each runs in a process of its own; together they
take a few minutes on a loaded 2-core machine (measured figures: the report of issue 23).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm_probe import require

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
TIMEOUT_S = 480


def module_constant(tree: ast.Module, name: str) -> object:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def has_main_block(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


def benchmarks() -> dict[str, tuple[str, ...]]:
    """Benchmark module name -> what it requires."""
    found: dict[str, tuple[str, ...]] = {}
    for path in sorted(BENCHMARKS.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        if has_main_block(tree) and not module_constant(tree, "NOT_A_BENCHMARK") \
                and not module_constant(tree, "SMOKE_TESTED_IN"):
            found[path.stem] = tuple(module_constant(tree, "REQUIRES") or ())  # type: ignore[arg-type]
    return found


def check(requirement: str, benchmark: str) -> None:
    """Skip (the Slurm probe: fail where the project's cluster is required) when it is absent."""
    if requirement == "slurm":
        require(nodes=2)   # benchmarks.scaling --quick launches 1 and 2 nodes
    elif requirement == "fuse":   # the NFS-like rig (tests/fsrig): FUSE views in mount namespaces
        if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
            pytest.skip(f"benchmarks.{benchmark} mounts FUSE views of the NFS-like rig: root and /dev/fuse (CI runs as root)")
    elif requirement in ("bwrap", "tmux"):
        if not shutil.which(requirement):
            pytest.skip(f"benchmarks.{benchmark} needs {requirement}: not installed (scripts/test.sh installs it)")
    else:
        pytest.fail(f"benchmarks.{benchmark}: unknown requirement {requirement!r}; name one of slurm, bwrap, tmux, fuse")


def params() -> list[object]:
    return [pytest.param(name, needs, id=name, marks=[pytest.mark.slurm] if "slurm" in needs else [])
            for name, needs in benchmarks().items()]


def test_the_walk_finds_the_benchmarks_and_only_them() -> None:
    found = benchmarks()
    assert {"overhead", "routing", "scale", "pipeline"} <= set(found)
    assert not {"common", "synthetic_run", "proxy_client", "__init__"} & set(found)


def test_a_benchmark_smoke_tested_elsewhere_names_a_test_that_runs_its_quick_size() -> None:
    for path in sorted(BENCHMARKS.glob("*.py")):
        where = module_constant(ast.parse(path.read_text(), filename=str(path)), "SMOKE_TESTED_IN")
        if where:
            test = REPO / str(where)
            assert test.is_file(), f"{path.name}: SMOKE_TESTED_IN names {where}, which does not exist"
            assert f"benchmarks.{path.stem}" in test.read_text() and "--quick" in test.read_text(), (
                f"{where} does not run `python -m benchmarks.{path.stem} --quick`")


@pytest.mark.parametrize("name, needs", params())
def test_benchmark_runs_quick_and_prints_its_json_line(name: str, needs: tuple[str, ...]) -> None:
    for requirement in needs:
        check(requirement, name)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--quick"], cwd=REPO,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    seconds = time.monotonic() - started
    tail = f"\n--- stdout (end) ---\n{done.stdout[-3000:]}\n--- stderr (end) ---\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"benchmarks.{name} --quick exited {done.returncode} after {seconds:.0f} s{tail}"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, f"benchmarks.{name} printed nothing{tail}"
    try:
        figures = json.loads(lines[-1])
    except json.JSONDecodeError:
        pytest.fail(f"benchmarks.{name}: the last line is not JSON: {lines[-1][:200]!r}{tail}")
    assert isinstance(figures, dict) and any(isinstance(v, (int, float)) and not isinstance(v, bool)
                                             for v in figures.values()), f"no figure in {lines[-1][:300]}"
    print(f"benchmarks.{name} --quick: {seconds:.1f} s")


def test_waiting_for_rows_waits_through_the_moment_before_the_first_shard(tmp_path: Path) -> None:
    # No job is pending and no shard is committed yet: the last job resolved, its row is still
    # in the worker's buffer. That is "not yet", not a schema error (it crashed benchmarks.verl).
    from benchmarks.backends import wait_drained
    from tests.core.util import make_run

    paths = make_run(tmp_path / "run")
    with pytest.raises(RuntimeError, match="did not finish 1 rows"):
        wait_drained(paths, 1, timeout_s=0.3)


def test_a_benchmark_stops_at_once_when_its_own_submission_is_refused(tmp_path: Path) -> None:
    # It waited 30 minutes for rows a refused submission would never make (a python without the
    # package's handlers); now it names the refusal.
    from benchmarks.common import submit_all
    from tests.core.util import make_run

    paths = make_run(tmp_path / "run")
    with pytest.raises(SystemExit, match=r"refused \(1 rows\), line 1: .*no-such-handler"):
        submit_all(paths, [(1, {"prompt": "x"})], handler="no-such-handler")
