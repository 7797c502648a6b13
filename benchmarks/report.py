"""`hpc-rollout report` on a large run: 1e5 finished jobs, made up fast (benchmarks/synthetic_run.py).

    python -m benchmarks.report [--jobs 100000]

Figures: seconds to synthesise the run; seconds for `hpc-rollout report RUN` end to end (a fresh
process: imports, reading, figures, page; target <= 10 s for 1e5 jobs on 2 cores), with the CPU
seconds it used (wall time on a shared machine also counts others' work: the load average is
printed); then, in this process, the split between reading + computing and drawing.
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

from benchmarks.common import emit_json, parse_args, print_table
from benchmarks.synthetic_run import synthesize

TARGET_S = 10.0


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"jobs": 500}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    args = parse_args(parser, QUICK)
    base = Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        started = time.perf_counter()
        paths = synthesize(base / "run", args.jobs)
        synth_s = time.perf_counter() - started
        load_before = os.getloadavg()[0]
        cpu_before = _cpu_children()
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", "report", str(paths.root)],
                              capture_output=True, text=True)
        report_s = time.perf_counter() - started
        report_cpu_s = _cpu_children() - cpu_before
        if done.returncode != 0:
            raise SystemExit(f"report failed:\n{done.stdout}\n{done.stderr}")
        from orchestrator.report.figures import draw_all
        from orchestrator.report.model import load_report

        started = time.perf_counter()
        report = load_report(paths)
        load_s = time.perf_counter() - started
        (base / "again").mkdir()
        started = time.perf_counter()
        draw_all(report, base / "again")
        draw_s = time.perf_counter() - started
        assert report.finished.jobs == args.jobs, (report.finished.jobs, args.jobs)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    key = f"{args.jobs:.0e}".replace("+0", "").replace("+", "")
    print(done.stdout.splitlines()[1] if done.stdout else "")
    print_table(f"report on {args.jobs} jobs (load average {load_before:.1f} on {os.cpu_count()} cores)", ["part", "seconds"], [
        ["synthesise the run (shards, events, heartbeats)", synth_s],
        ["hpc-rollout report RUN, wall", report_s], ["hpc-rollout report RUN, CPU", report_cpu_s],
        ["  read and compute (in process)", load_s], ["  draw the figures (in process)", draw_s],
        ["target (wall, 2 idle cores)", TARGET_S],
    ])
    emit_json({f"report_s_{key}_jobs": round(report_s, 2), "report_cpu_s": round(report_cpu_s, 2),
               "load_s": round(load_s, 2), "draw_s": round(draw_s, 2), "synthesise_s": round(synth_s, 2),
               "jobs": args.jobs, "target_s": TARGET_S, "load_average": round(load_before, 2)})


if __name__ == "__main__":
    main()
