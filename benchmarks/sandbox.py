"""Sandbox benchmark: `python -m benchmarks.sandbox [--quick]`.

Measures, with real bubblewrap on this machine:
  - the bash tool round trip for `true` through the execution server (median, p99);
  - the conventional tmux approach (send-keys + capture-pane busy poll) for comparison;
  - sandbox start-to-ready and close (median);
  - how many sandboxes are alive and answering at once (target: 100).
Prints a table, then as its last line one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.spool.paths import SpoolPaths
from orchestrator.sandbox.start import start_sandbox
from orchestrator.sandbox.process import ProcessSandbox


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def bench_bash(spool: SpoolPaths, rounds: int) -> list[float]:
    sandbox = await start_sandbox("bwrap", job_id="bench-bash", paths=spool)
    try:
        for _ in range(20):  # warm-up: shell started, connection open
            await sandbox.bash("true")
        samples = []
        for _ in range(rounds):
            started = time.perf_counter()
            result = await sandbox.bash("true")
            samples.append((time.perf_counter() - started) * 1000)
            assert result.exit_code == 0, result
        return samples
    finally:
        await sandbox.close()


def bench_tmux(rounds: int) -> list[float]:
    """send-keys, then poll capture-pane until the command's marker shows up."""
    if shutil.which("tmux") is None:
        return []
    server = f"hr-bench-{os.getpid()}"   # our own tmux server socket: stopped by name of socket
    base = ["tmux", "-L", server, "-f", "/dev/null"]
    subprocess.run(base + ["new-session", "-d", "-s", "bench", "-x", "200", "-y", "50",
                           "env -i PATH=/usr/bin:/bin TERM=dumb bash --norc --noprofile"], check=True)
    try:
        samples = []
        for index in range(rounds + 5):
            marker = f"__done_{index}__"
            started = time.perf_counter()
            subprocess.run(base + ["send-keys", "-t", "bench", f"true; echo {marker}", "Enter"], check=True)
            while True:
                pane = subprocess.run(base + ["capture-pane", "-p", "-t", "bench"],
                                      capture_output=True, text=True).stdout
                # The marker appears twice once done: in the typed line and in the output.
                if pane.count(marker) >= 2:
                    break
            if index >= 5:
                samples.append((time.perf_counter() - started) * 1000)
            if index % 20 == 0:
                subprocess.run(base + ["send-keys", "-t", "bench", "clear", "Enter"], check=True)
                subprocess.run(base + ["clear-history", "-t", "bench"], check=True)
        return samples
    finally:
        subprocess.run(base + ["kill-server"], capture_output=True)


async def bench_lifecycle(spool: SpoolPaths, rounds: int) -> tuple[list[float], list[float]]:
    starts, closes = [], []
    for index in range(rounds):
        began = time.perf_counter()
        sandbox = await start_sandbox("bwrap", job_id=f"bench-life-{index}", paths=spool)
        starts.append((time.perf_counter() - began) * 1000)
        await sandbox.bash("true")
        began = time.perf_counter()
        await sandbox.close()
        closes.append((time.perf_counter() - began) * 1000)
    return starts, closes


async def bench_concurrent(spool: SpoolPaths, target: int) -> int:
    """Start `target` sandboxes, check each answers while all are alive, close them all."""
    results = await asyncio.gather(
        *(start_sandbox("bwrap", job_id=f"bench-many-{i}", paths=spool) for i in range(target)),
        return_exceptions=True,
    )
    sandboxes = [r for r in results if isinstance(r, ProcessSandbox)]
    try:
        answers = await asyncio.gather(*(s.bash("echo $HPC_ROLLOUT_LOOPBACK") for s in sandboxes))
        alive = sum(1 for s, a in zip(sandboxes, answers) if a.exit_code == 0 and s.alive())
        assert len({a.output for a in answers}) == len(answers), "loopback addresses must be unique"
        return alive
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


async def main(quick: bool) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="hr-bench-"))
    spool = SpoolPaths.of(scratch / "spool")
    try:
        bash = await bench_bash(spool, 200 if quick else 1000)
        tmux = bench_tmux(30 if quick else 200)
        starts, closes = await bench_lifecycle(spool, 10 if quick else 40)
        concurrent = await bench_concurrent(spool, 100)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    bash_median = statistics.median(bash)
    tmux_median = statistics.median(tmux) if tmux else float("nan")
    figures = {
        "bash_median_ms": round(bash_median, 3),
        "bash_p99_ms": round(percentile(bash, 99), 3),
        "tmux_median_ms": round(tmux_median, 3),
        "speedup_vs_tmux": round(tmux_median / bash_median, 1) if tmux else None,
        "start_median_ms": round(statistics.median(starts), 1),
        "close_median_ms": round(statistics.median(closes), 1),
        "max_concurrent": concurrent,
    }
    rows = [
        ("bash tool `true`, median / p99", f"{figures['bash_median_ms']} / {figures['bash_p99_ms']} ms", "<= 1 ms median"),
        ("tmux send-keys + capture-pane, median", f"{figures['tmux_median_ms']} ms", ""),
        ("speed-up over tmux", f"{figures['speedup_vs_tmux']}x", ">= 30x"),
        ("start to ready, median", f"{figures['start_median_ms']} ms", "<= 100 ms"),
        ("close (verified), median", f"{figures['close_median_ms']} ms", "<= 100 ms"),
        ("sandboxes alive at once", str(concurrent), "100"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(width)}  {'result':>22}  target")
    for name, value, target in rows:
        print(f"{name.ljust(width)}  {value:>22}  {target}")
    print(f"(bubblewrap, {os.cpu_count()} cores, {len(bash)} bash samples, {len(tmux)} tmux samples)")
    return figures


# what tests/test_benchmarks.py checks for before running it (--quick: fewer rounds)
REQUIRES = ("bwrap", "tmux")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (for a smoke run)")
    figures = asyncio.run(main(parser.parse_args().quick))
    print(json.dumps(figures))
