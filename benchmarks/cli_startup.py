"""How long `hpc-rollout` takes to start, beside `python -c pass`, in one run (issue 39, item 9).

    python -m benchmarks.cli_startup [--runs 15]

Each figure is the median wall time of --runs fresh processes, the commands taken in turn so
that a change of the machine's load reaches all of them alike, with the median CPU time (user +
system) of the same processes beside it, which a busy machine blurs less:
  python -c pass           the interpreter alone: the floor, and how fast the machine is now
  hpc-rollout --version    importing the command line and its command table, nothing more
  hpc-rollout --help
  hpc-rollout status RUN   RUN made by `hpc-rollout init` (no shard yet, no worker)
Goal: <= 0.5 s for the three commands on an idle machine; the ratio to `python -c pass` says
how much of a figure measured on a busy one is the machine.

The console script runs under this interpreter (a pyenv shim in front of it costs a bash and
pyenv's own start, ~0.1 s, that no change here can remove). Byte code is cached in a directory
of the benchmark's own, filled by a first run of each command, as an installed package has it;
the `--help` and `status` rows marked "compiled" run with PYTHONDONTWRITEBYTECODE=1 and so
compile the package's modules at every start, as wherever that is set and no __pycache__ exists
(a test suite run there pays it at each of its hundreds of CLI calls).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import emit_json, median, parse_args, print_table

GOAL_S = 0.5
CLI = "from orchestrator.cli import main; main()"   # what tests/core/util.py runs when there is no script


def cli_command() -> list[str]:
    """The installed `hpc-rollout` script under this interpreter, else the same entry point by -c."""
    script = Path(sys.executable).parent / "hpc-rollout"
    return [sys.executable, str(script)] if script.is_file() else [sys.executable, "-c", CLI]


def environments(cache: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(byte code cached in `cache`, byte code compiled at every start and never written)."""
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = str(cache)
    compiled = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    compiled["PYTHONDONTWRITEBYTECODE"] = "1"
    return cached, compiled


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `argv`; the benchmark waits for no other child meanwhile."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15, help="fresh processes per command (the median is shown)")
    args = parse_args(parser, {"runs": 3})
    base = Path(tempfile.mkdtemp(prefix="bench-cli-startup-"))
    try:
        cli = cli_command()
        cached, compiled = environments(base / "pycache")
        run_dir = base / "run"
        subprocess.run([*cli, "init", str(run_dir)], env=cached, check=True, stdout=subprocess.DEVNULL, timeout=120)
        cases = {   # name -> (argv, environment, goal)
            "python -c pass": ([sys.executable, "-c", "pass"], cached, None),
            "hpc-rollout --version": ([*cli, "--version"], cached, GOAL_S),
            "hpc-rollout --help": ([*cli, "--help"], cached, GOAL_S),
            "hpc-rollout status RUN": ([*cli, "status", str(run_dir)], cached, GOAL_S),
            "hpc-rollout --help, compiled": ([*cli, "--help"], compiled, None),
            "hpc-rollout status RUN, compiled": ([*cli, "status", str(run_dir)], compiled, None),
        }
        for argv, env, _ in cases.values():   # fills the byte-code cache; not measured
            timed(argv, env)
        load_before = os.getloadavg()[0]
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, (argv, env, _) in cases.items():
                wall, used = timed(argv, env)
                times[name].append(wall)
                cpu[name].append(used)
        load_after = os.getloadavg()[0]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    figures = {name: median(values) for name, values in times.items()}
    cpu_figures = {name: median(values) for name, values in cpu.items()}
    floor = figures["python -c pass"]
    print_table(f"start-up, median of {args.runs} fresh processes each (load average {load_before:.1f} -> "
                f"{load_after:.1f} on {os.cpu_count()} CPUs; the goal is for an idle machine)",
                ["command", "median s", "min s", "CPU s", "goal s", "x python -c pass"],
                [[name, figures[name], min(times[name]), cpu_figures[name], "-" if goal is None else f"<= {goal}",
                  f"{figures[name] / floor:.1f}"] for name, (_, _, goal) in cases.items()])
    emit_json({
        "python_pass_s": round(floor, 3),
        "version_s": round(figures["hpc-rollout --version"], 3),
        "help_s": round(figures["hpc-rollout --help"], 3),
        "status_s": round(figures["hpc-rollout status RUN"], 3),
        "help_compiled_s": round(figures["hpc-rollout --help, compiled"], 3),
        "status_compiled_s": round(figures["hpc-rollout status RUN, compiled"], 3),
        "help_cpu_s": round(cpu_figures["hpc-rollout --help"], 3),
        "status_cpu_s": round(cpu_figures["hpc-rollout status RUN"], 3),
        "python_pass_cpu_s": round(cpu_figures["python -c pass"], 3),
        "help_ratio_to_python": round(figures["hpc-rollout --help"] / floor, 1),
        "status_ratio_to_python": round(figures["hpc-rollout status RUN"] / floor, 1),
        "goal_s": GOAL_S,
        "help_within_goal": figures["hpc-rollout --help"] <= GOAL_S,
        "status_within_goal": figures["hpc-rollout status RUN"] <= GOAL_S,
        "runs": args.runs, "load_average_before": round(load_before, 2), "load_average_after": round(load_after, 2),
    })


if __name__ == "__main__":
    main()
