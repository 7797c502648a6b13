"""Runs benchmarks as programs of their own and reads the JSON line each prints last.

Each benchmark runs as `python -m benchmarks.NAME ARGS` in a process (and session) of its own,
exactly as a person or tests/test_benchmarks.py runs it: a benchmark that crashes, hangs or leaks
a process cannot take the others with it, and a timeout kills its whole process group. Its output
goes to a log folder (NAME.out, NAME.err), printed at the end for a closer look.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks import machine
from benchmarks.headlines import Benchmark

REPO = Path(__file__).resolve().parents[1]


class Status(str, enum.Enum):
    RAN = "ran"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Outcome:
    """One benchmark's run: its figures (the JSON line), or why there are none."""

    name: str
    status: Status
    command: str
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0
    load_1min: float | None = None      # before it started, as `uptime` showed it
    others_cores: float | None = None   # cores others used while it ran (benchmarks/machine.py)
    cpu_s: float | None = None          # CPU seconds it and its descendants used (one lane only)


def command_line(benchmark: Benchmark, quick: bool) -> list[str]:
    return [sys.executable, "-m", benchmark.module, *benchmark.argv(quick)]


def display(argv: Sequence[str]) -> str:
    """The command as a person would type it."""
    return " ".join(["python", *argv[1:]])


def missing_requirement(requirement: str) -> str | None:
    """Why `requirement` (a benchmark's REQUIRES or `needs`) is not met here; None when it is."""
    if requirement in ("bwrap", "tmux"):
        return None if shutil.which(requirement) else f"needs {requirement} (not installed)"
    if requirement == "fuse":
        ok = os.geteuid() == 0 and os.path.exists("/dev/fuse")
        return None if ok else "needs root and /dev/fuse (the NFS-like rig mounts FUSE views)"
    if requirement == "slurm":
        return None if _slurm_answers() else "needs a Slurm cluster (sudo SLURM_NODES=4 scripts/slurm-up.sh)"
    if requirement == "verl":
        # only checked: installing verl's venv takes many minutes and is scripts/verl-setup.sh's job
        done = subprocess.run(["bash", str(REPO / "scripts" / "verl-setup.sh")], capture_output=True,
                              env={**os.environ, "VERL_SETUP_CHECK_ONLY": "1"}, timeout=120)
        return None if done.returncode == 0 else "needs verl's venv (bash scripts/verl-setup.sh)"
    return f"unknown requirement {requirement!r}: name one of bwrap, tmux, fuse, slurm, verl"


def _slurm_answers() -> bool:
    from orchestrator.slurm.cluster import slurm_available

    if not slurm_available():
        return False
    try:
        return subprocess.run(["scontrol", "ping"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def last_json(stdout: str) -> dict[str, Any] | None:
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        figures = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return figures if isinstance(figures, dict) else None


def _why_failed(code: int | None, stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1][:160] if lines else "nothing on stderr"
    return f"exit {code}: {last}"


def execute(argv: Sequence[str], timeout_s: float, out_path: Path, err_path: Path) -> int | None:
    """Run `argv` in a session of its own; its exit code, None when it timed out (then the whole
    session, the benchmark and whatever it started, is killed)."""
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        process = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=err, start_new_session=True)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return None


def run_one(benchmark: Benchmark, quick: bool, logs: Path, reap: bool, without: frozenset[str] = frozenset()) -> Outcome:
    """Run one benchmark (or say why not); `reap`: collect orphans after it (sequential runs only);
    `without`: requirements to treat as absent (the suite leaves the Slurm cluster to its own tests)."""
    argv = command_line(benchmark, quick)
    skipped = Outcome(benchmark.name, Status.SKIPPED, display(argv))
    for requirement in benchmark.requires():
        why = f"needs {requirement}, left out (--without)" if requirement in without else missing_requirement(requirement)
        if why:
            return replace(skipped, reason=why)
    out_path, err_path = logs / f"{benchmark.name}.out", logs / f"{benchmark.name}.err"
    before = machine.sample()
    code = execute(argv, benchmark.timeout_s, out_path, err_path)
    if reap:
        machine.reap_orphans()
    after = machine.sample()
    # side by side (reap False), the other lanes' processes would count as others' until reaped
    others = machine.others_cores(before, after) if reap else None
    failed = replace(skipped, status=Status.FAILED, seconds=after.at - before.at, load_1min=before.load_1min,
                     others_cores=others, cpu_s=after.ours_s - before.ours_s if reap else None)
    if code is None:
        return replace(failed, reason=f"timed out after {benchmark.timeout_s:.0f} s")
    if code != 0:
        return replace(failed, reason=_why_failed(code, err_path.read_text(errors="replace")))
    figures = last_json(out_path.read_text(errors="replace"))
    if figures is None:
        return replace(failed, reason="its last line is not a JSON object")
    return replace(failed, status=Status.RAN, figures=figures)


def run_all(benchmarks: Sequence[Benchmark], quick: bool, logs: Path, lanes: int = 1,
            progress: Callable[[Outcome], None] | None = None, without: frozenset[str] = frozenset()) -> list[Outcome]:
    """Every benchmark, in order, `lanes` at a time; outcomes in the order given.

    One lane for figures that are compared: two benchmarks side by side slow each other down.
    More lanes only for --quick, whose tiny sizes are compared with nothing: a tiny run waits for
    much of its time (servers starting, sleep jobs), which overlaps with another's work."""
    def one(benchmark: Benchmark) -> Outcome:
        try:
            outcome = run_one(benchmark, quick, logs, reap=lanes <= 1, without=without)
        except Exception as exc:   # the runner's own trouble with one benchmark (a requirement's check
            # hanging, no python to start): that benchmark fails, the others still run
            outcome = Outcome(benchmark.name, Status.FAILED, display(command_line(benchmark, quick)),
                              reason=f"{type(exc).__name__}: {exc}")
        if progress:
            progress(outcome)
        return outcome

    if lanes <= 1:
        return [one(benchmark) for benchmark in benchmarks]

    with ThreadPoolExecutor(max_workers=lanes) as pool:
        outcomes = list(pool.map(one, benchmarks))
    machine.reap_orphans()
    return outcomes
