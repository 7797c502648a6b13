"""Node-seconds held idle with `adapt` vs a fixed `launch --nodes N`, on the same bursty workload.

    python -m benchmarks.adapt [--nodes 4] [--bursts 3] [--period-s 60] [--run-s 1.5] [--waves 3]

Needs the real cluster (`sudo SLURM_NODES=4 scripts/slurm-up.sh`). Workload: --bursts bursts
of `sleep` jobs (RUN --run-s seconds; nodes x pool x waves jobs each), one every --period-s
seconds, the same for both sides, which run one after the other on fresh run directories:

- fixed: `launch --nodes N` (no idle exit), started and serving before the first burst;
- adapt: the `adapt` controller (min 0, max N, idle exit --idle-exit-s, one look a second,
  run in this process through the same code as the CLI), no worker before the first burst.

Node-seconds held come from Slurm's accounting (sacct Start/End of every task), busy time
from the spool's events (union of the stage intervals of each worker); idle = held - busy.
The window opens at the first burst's submission. It closes when the last job finishes for
the fixed launch (as if the user stopped it at that very moment: the most favourable case
for fixed nodes), and when the last adapt task has left Slurm for adapt (its idle tails
count). makespan = last job finished - first burst submitted.

Each adapt task pays a start (allocation to first stage: Python and the worker starting) and
a tail (last stage to the end of the allocation: idle exit, shard commit, exit); both are
shown. The idle ratio is about tasks x (start + tail) / (nodes x quiet time between bursts),
so it falls with longer gaps and a shorter idle exit: the defaults (gaps of ~55 s, idle exit
2 s) compress a cluster's minutes into seconds.

Targets: idle_node_seconds_ratio (adapt / fixed) <= 0.2, makespan_ratio (adapt / fixed) <= 1.1.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from benchmarks.common import emit_json, parse_args, print_table, submit_all
from orchestrator.spool.events import events_named
from orchestrator.spool.liveness import read_workers
from orchestrator.spool.launches import request_stop
from orchestrator.spool.paths import SpoolPaths
from orchestrator.slurm.scaling import Bounds
from orchestrator.slurm.adapt import AdaptSettings, Controller
from orchestrator.slurm.cluster import run_slurm, slurm_available
from orchestrator.slurm.launcher import launch
from orchestrator.slurm.options import LaunchOptions
from orchestrator.slurm.queries import cancel, still_queued, task_of
from orchestrator.spool.rundir import init_run
from orchestrator.report.status import pending_count
from orchestrator.worker.options import WorkerOptions

RUN_SETTINGS = {"leases.heartbeat_s": 1.0, "leases.lease_s": 30.0, "shards.idle_flush_s": 0.5}
STAGES = ("init", "run", "eval")


def launched_arrays(paths: SpoolPaths) -> list[str]:
    return [str(a["job_id"]) for record in paths.logs.glob("*/slurm.json")
            for a in orjson.loads(record.read_bytes())["arrays"] if a.get("job_id")]


def held_spans(arrays: list[str]) -> dict[str, tuple[float, float]]:
    """Task -> (start, end) of its allocation, from sacct; a task still running ends now."""
    text = run_slurm(["sacct", "-n", "-P", "-X", "-o", "JobID,Start,End", "-j", ",".join(arrays)])
    spans = {}
    for line in text.splitlines():
        task, start, end = line.split("|")
        if start in ("", "Unknown", "None"):
            continue   # never started (withdrawn while pending): held no node
        spans[task] = (_local_epoch(start), _local_epoch(end) if end not in ("", "Unknown") else time.time())
    return spans


def _local_epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))   # sacct prints local time


def busy_intervals(paths: SpoolPaths) -> dict[str, list[tuple[float, float]]]:
    """Worker -> its stage intervals, sorted (any stage running = its node is busy)."""
    opened: dict[tuple[str, str, str], float] = {}
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for stage in STAGES:
        for record in events_named(paths, f"{stage}_started"):
            opened[(record["worker"], record["job"], stage)] = float(record["t"])
        for record in events_named(paths, f"{stage}_finished"):
            began = opened.pop((record["worker"], record["job"], stage), None)
            if began is not None:
                intervals[record["worker"]].append((began, float(record["t"])))
    return {worker: sorted(spans) for worker, spans in intervals.items()}


def union_seconds(spans: list[tuple[float, float]], start: float, end: float) -> float:
    total, cursor = 0.0, start
    for lo, hi in spans:
        lo, hi = max(lo, cursor), min(hi, end)
        if hi > lo:
            total += hi - lo
            cursor = hi
    return total


def task_of_worker(paths: SpoolPaths) -> dict[str, str]:
    """Worker -> the Slurm task it ran in, from the heartbeats (live and retired)."""
    found = {}
    for path in [*paths.workers.glob("*.json"), *paths.workers.glob("gone/*.json")]:
        info = orjson.loads(path.read_bytes())
        task = task_of(info)
        if task:
            found[str(info["worker_id"])] = task
    return found


def submit_bursts(paths: SpoolPaths, args: argparse.Namespace, jobs_per_burst: int) -> float:
    row = {"handler": "sleep", "instance": {"run": args.run_s}}
    first = time.time()
    for burst in range(args.bursts):
        time.sleep(max(0.0, first + burst * args.period_s - time.time()))
        submit_all(paths, ((i, row) for i in range(jobs_per_burst)))
    deadline = time.monotonic() + args.timeout_s
    while pending_count(paths) and time.monotonic() < deadline:
        time.sleep(0.25)
    if pending_count(paths):
        raise RuntimeError(f"{pending_count(paths)} jobs still pending after {args.timeout_s}s")
    return first


def wait_gone(arrays: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while still_queued(arrays) and time.monotonic() < deadline:
        time.sleep(0.5)
    if still_queued(arrays):
        cancel(arrays)
        while still_queued(arrays):
            time.sleep(0.5)


def figures(paths: SpoolPaths, first: float, end: float, jobs: int) -> dict[str, Any]:
    last_finish = max(float(r["t"]) for r in events_named(paths, "finished"))
    spans = held_spans(launched_arrays(paths))
    busy = busy_intervals(paths)
    held_s = sum(max(0.0, min(hi, end) - max(lo, first)) for lo, hi in spans.values())
    busy_s = sum(union_seconds(intervals, first, end) for intervals in busy.values())
    # Where a task's idle time goes: before its first stage, and after its last one.
    tasks = task_of_worker(paths)
    starts, tails = [], []
    for worker, intervals in busy.items():
        span = spans.get(tasks.get(worker, ""))
        if span:
            starts.append(intervals[0][0] - span[0])
            tails.append(span[1] - max(hi for _, hi in intervals))
    return {"jobs": len(events_named(paths, "finished")), "expected": jobs, "makespan_s": last_finish - first,
            "held_node_s": held_s, "busy_node_s": busy_s, "idle_node_s": max(0.0, held_s - busy_s),
            "tasks": len(spans), "start_s": sum(starts) / max(1, len(starts)), "tail_s": sum(tails) / max(1, len(tails))}


def run_fixed(root: Path, args: argparse.Namespace, worker: WorkerOptions, jobs_per_burst: int) -> dict[str, Any]:
    paths, _ = init_run(root / "fixed", RUN_SETTINGS)
    result = launch(paths.root, LaunchOptions(nodes=args.nodes, time="00:30:00", job_name="bench-adapt"), worker)
    try:
        deadline = time.monotonic() + 120
        while len([w for w in read_workers(paths, 10.0) if w.alive]) < args.nodes and time.monotonic() < deadline:
            time.sleep(0.25)
        first = submit_bursts(paths, args, jobs_per_burst)
        end = max(float(r["t"]) for r in events_named(paths, "finished"))
    finally:
        request_stop(paths)
        wait_gone(result.array_ids, 60)
    return figures(paths, first, end, args.bursts * jobs_per_burst)


def run_adapt(root: Path, args: argparse.Namespace, worker: WorkerOptions, jobs_per_burst: int) -> dict[str, Any]:
    paths, _ = init_run(root / "adapt", RUN_SETTINGS)
    settings = AdaptSettings(Bounds(0, args.nodes, args.pool, cooldown_s=args.cooldown_s),
                             idle_exit_s=args.idle_exit_s, interval_s=args.interval_s, lease_stale_s=30.0)
    controller = Controller(paths.root, settings, LaunchOptions(nodes=1, time="00:30:00", job_name="bench-adapt"), worker)
    stop = threading.Event()
    thread = threading.Thread(target=controller.serve, args=(stop.is_set,), daemon=True)
    thread.start()
    try:
        first = submit_bursts(paths, args, jobs_per_burst)
        # The workers leave by themselves: the window closes when the last task has left Slurm.
        deadline = time.monotonic() + args.idle_exit_s + 60
        while still_queued(launched_arrays(paths)) and time.monotonic() < deadline:
            time.sleep(0.25)
        end = time.time()
    finally:
        stop.set()
        thread.join(30)
        request_stop(paths)
        wait_gone(launched_arrays(paths), 60)
    return figures(paths, first, end, args.bursts * jobs_per_burst)


REQUIRES = ("slurm",)   # what tests/test_benchmarks.py checks for before running it
# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"nodes": 1, "bursts": 1, "period_s": 5.0, "run_s": 0.2, "waves": 1, "pool": 1, "idle_exit_s": 1.0, "interval_s": 0.5, "cooldown_s": 0.5, "timeout_s": 120.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4, help="fixed launch size, and adapt's --max")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--period-s", type=float, default=60.0, help="seconds between the starts of two bursts")
    parser.add_argument("--run-s", type=float, default=1.5, help="RUN seconds of each sleep job")
    parser.add_argument("--waves", type=int, default=3, help="jobs per RUN slot and node in each burst")
    parser.add_argument("--pool", type=int, default=4, help="INIT/RUN/EVAL slots per node worker")
    parser.add_argument("--idle-exit-s", type=float, default=2.0)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--cooldown-s", type=float, default=2.0)
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the run directories (printed) for a closer look")
    args = parse_args(parser, QUICK)
    if not slurm_available() or subprocess.run(["scontrol", "ping"], capture_output=True).returncode:
        print("no Slurm cluster here: start one with `sudo SLURM_NODES=4 scripts/slurm-up.sh`")
        emit_json({"idle_node_seconds_ratio": None, "makespan_ratio": None, "error": "no slurm"})
        raise SystemExit(2)
    worker = WorkerOptions(init_pool=args.pool, run_pool=args.pool, eval_pool=args.pool, max_prepared=args.pool)
    jobs_per_burst = args.nodes * args.pool * args.waves
    root = Path(tempfile.mkdtemp(prefix="bench-adapt-"))
    try:
        fixed = run_fixed(root, args, worker, jobs_per_burst)
        print(f"  fixed: makespan {fixed['makespan_s']:.1f}s, idle {fixed['idle_node_s']:.0f} node-s", flush=True)
        adaptive = run_adapt(root, args, worker, jobs_per_burst)
        print(f"  adapt: makespan {adaptive['makespan_s']:.1f}s, idle {adaptive['idle_node_s']:.0f} node-s", flush=True)
    finally:
        if args.keep:
            print(f"  run directories kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    for side in (fixed, adaptive):
        if side["jobs"] != side["expected"]:
            raise SystemExit(f"lost or repeated jobs: {side['jobs']} finished of {side['expected']}")
    print_table(
        f"{args.bursts} bursts of {jobs_per_burst} sleep jobs (RUN {args.run_s:g}s) every {args.period_s:g}s, "
        f"{args.nodes} nodes x {args.pool} slots; adapt: min 0, max {args.nodes}, idle exit {args.idle_exit_s:g}s",
        ["launch", "jobs", "tasks", "makespan s", "held node-s", "busy node-s", "idle node-s",
         "task start->1st stage s", "last stage->task end s"],
        [[name, r["jobs"], r["tasks"], r["makespan_s"], r["held_node_s"], r["busy_node_s"], r["idle_node_s"],
          *((r["start_s"], r["tail_s"]) if r is adaptive else ("-", "-"))]
         for name, r in (("fixed --nodes", fixed), ("adapt", adaptive))],
    )
    idle_ratio = adaptive["idle_node_s"] / max(fixed["idle_node_s"], 1e-9)
    makespan_ratio = adaptive["makespan_s"] / fixed["makespan_s"]
    print(f"\nidle node-seconds adapt/fixed: {idle_ratio:.3f} (target <= 0.2); makespan adapt/fixed: {makespan_ratio:.3f} (target <= 1.1)")
    emit_json({
        "idle_node_seconds_ratio": round(idle_ratio, 3), "makespan_ratio": round(makespan_ratio, 3),
        "idle_node_s": {"fixed": round(fixed["idle_node_s"], 1), "adapt": round(adaptive["idle_node_s"], 1)},
        "makespan_s": {"fixed": round(fixed["makespan_s"], 2), "adapt": round(adaptive["makespan_s"], 2)},
        "held_node_s": {"fixed": round(fixed["held_node_s"], 1), "adapt": round(adaptive["held_node_s"], 1)},
        "adapt_tasks": adaptive["tasks"],
        "adapt_task_start_s": round(adaptive["start_s"], 2), "adapt_task_tail_s": round(adaptive["tail_s"], 2),
    })


if __name__ == "__main__":
    main()
