"""Resource classes: short jobs beside long memory-hungry ones, first come first served vs by class.

    python -m benchmarks.classes [--quick] [--long 16] [--long-s 2.0] [--short 48] [--short-s 0.1]
                                 [--budget-mb 9216] [--long-mb 2048] [--short-mb 256] [--run-pool 8]

One real local worker (runtime local) and the `sleep` handler, the same mixed workload on each
side: --long jobs of --long-s seconds that each hold --long-mb of sandbox memory are queued, and
once the first of them runs, --short jobs of --short-s seconds holding --short-mb arrive. The node
gives sandboxes --budget-mb.

    fifo     today: no classes. Nothing knows what a job holds, so a node is kept within its budget
             by sizing for the largest job: pools.max_sandboxes = budget // long-mb. Jobs start in
             queue order.
    classes  run.toml [node] memory_mb = budget, [classes.long] and [classes.short]; the same RUN
             pool (--run-pool) with no max_sandboxes: the worker admits by class (worker/admission.py).
    uncapped (not at --quick) today without the cap: the same pools, nothing bounds the memory in
             use; shown for its peak (above the budget), not judged.

Figures: p95 latency (submit to finish) of the short jobs, fifo over classes (goal >= 3x);
makespan (first submit to last finish), classes over fifo (goal <= 1.05); peak declared memory in
use (the jobs' RUN spans from their rows, each job at its class's memory; for classes also the
worker's own accounting, its `admitted` events) against the budget (goal: never above).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.common import emit_json, parse_args, percentile, print_table
from orchestrator.app.local_launch import start_local_workers
from orchestrator.report.status import pending_count
from orchestrator.spool import fsops, job_ids
from orchestrator.trainer.api import Spool
from orchestrator.worker.options import WorkerOptions

COMMON = {"shards.idle_flush_s": 0.02, "shards.max_age_s": 0.2, "leases.heartbeat_s": 1.0, "pools.eval": 8}


def settings(args: argparse.Namespace, side: str) -> dict[str, Any]:
    pools = {"pools.run": args.run_pool, "pools.init": args.run_pool, "pools.max_prepared": args.run_pool}
    if side == "uncapped":
        return {**COMMON, **pools}
    if side == "fifo":
        return {**COMMON, **pools, "pools.max_sandboxes": args.budget_mb // args.long_mb}
    return {**COMMON, **pools, "node.memory_mb": args.budget_mb,
            "classes.long.memory_mb": args.long_mb, "classes.long.expected_s": args.long_s,
            "classes.short.memory_mb": args.short_mb, "classes.short.expected_s": args.short_s}


def run_side(base: Path, name: str, args: argparse.Namespace) -> dict[str, Any]:
    classes = name == "classes"
    spool = Spool.create(base / name, **settings(args, name))
    launch = start_local_workers(spool.paths, 1, WorkerOptions(runtime="local"), verbose=0)
    try:
        deadline = time.monotonic() + 60
        while not list(spool.paths.workers.glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        long_ = spool.submit([{"handler": "sleep", "instance": {"run": args.long_s}}] * args.long,
                             resource_class="long" if classes else None)
        while not events(spool, "run_started") and time.monotonic() < deadline + 60:
            time.sleep(0.02)
        short = spool.submit([{"handler": "sleep", "instance": {"run": args.short_s}}] * args.short,
                             resource_class="short" if classes else None)
        total = args.long + args.short
        deadline = time.monotonic() + 600
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            if not pending_count(spool.paths):
                rows = list(spool.reader(columns=("job_id", "status", "submitted_at", "run_started_at",
                                                  "run_ended_at", "finished_at")).rows())
                if len(rows) >= total:
                    break
            time.sleep(0.05)
    finally:
        launch.terminate(timeout_s=60)
    if len(rows) < total or any(r["status"] != "ok" for r in rows):
        raise SystemExit(f"{name}: {len(rows)} of {total} rows, statuses {sorted({r['status'] for r in rows})}")
    memory = {long_.submission_id: args.long_mb, short.submission_id: args.short_mb}
    figures = measure(rows, memory, short.submission_id)
    figures["worker_peak_mb"] = worker_peak(spool) if classes else None
    return figures


def measure(rows: list[dict[str, Any]], memory: dict[str, int], short_submission: str) -> dict[str, Any]:
    def at(row: dict[str, Any], key: str) -> float:
        return float(row[key].timestamp())

    shorts = [at(r, "finished_at") - at(r, "submitted_at") for r in rows if submission_of(r["job_id"]) == short_submission]
    start = min(at(r, "submitted_at") for r in rows)
    # Declared memory in RUN at each RUN start: the peak of the step function is at one of them.
    spans = [(at(r, "run_started_at"), at(r, "run_ended_at"), memory[submission_of(r["job_id"])]) for r in rows]
    peak = max(sum(mb for s, e, mb in spans if s <= t < e) for t, _, _ in spans)
    return {"short_p95_s": percentile(shorts, 0.95), "short_p50_s": percentile(shorts, 0.5),
            "makespan_s": max(at(r, "finished_at") for r in rows) - start, "rows_peak_mb": peak}


def submission_of(job_id: str) -> str:
    parsed = job_ids.parse_job_id(job_id)
    assert parsed is not None, job_id
    return parsed.submission


def events(spool: Spool, kind: str) -> list[dict[str, Any]]:
    found = [orjson.loads(line) for log in spool.paths.root.glob("events/*.jsonl")
             for line in fsops.read_bytes(log, 1 << 30).splitlines() if line.strip()]
    return [event for event in found if event.get("event") == kind]


def worker_peak(spool: Spool) -> int:
    """The largest memory in use the worker's admission recorded (its `admitted` events)."""
    return max(int(event["memory_mb_in_use"]) for event in events(spool, "admitted"))


OPTIONS: tuple[tuple[str, type, Any, str], ...] = (
    ("--long", int, 16, "long jobs"), ("--long-s", float, 2.0, "seconds of RUN of a long job"),
    ("--short", int, 48, "short jobs"), ("--short-s", float, 0.1, "seconds of RUN of a short job"),
    ("--budget-mb", int, 9216, "the node's sandbox memory"), ("--long-mb", int, 2048, "memory of a long job"),
    ("--short-mb", int, 256, "memory of a short job"), ("--run-pool", int, 8, "RUN (and INIT) slots of the worker"),
    ("--uncapped", int, 1, "1: also run fifo without max_sandboxes (0 at --quick)"),
)

# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"long": 8, "long_s": 1.0, "short": 16, "short_s": 0.05, "uncapped": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kind, default, meaning in OPTIONS:
        parser.add_argument(flag, type=kind, default=default, help=meaning)
    args = parse_args(parser, QUICK)
    base = Path(tempfile.mkdtemp(prefix="bench-classes-"))
    try:
        fifo = run_side(base, "fifo", args)
        ours = run_side(base, "classes", args)
        uncapped = run_side(base, "uncapped", args) if args.uncapped else None
    finally:
        shutil.rmtree(base, ignore_errors=True)
    latency_gain = fifo["short_p95_s"] / ours["short_p95_s"]
    makespan_ratio = ours["makespan_s"] / fifo["makespan_s"]
    print_table(
        f"{args.long} long jobs ({args.long_s:g} s, {args.long_mb} MB) queued, then {args.short} short ({args.short_s:g} s, "
        f"{args.short_mb} MB), one worker, node budget {args.budget_mb} MB, load {os.getloadavg()[0]:.1f}",
        ["side", "short p50 s", "short p95 s", "makespan s", "peak MB (rows)", "peak MB (worker)", "how"],
        [["fifo", fifo["short_p50_s"], fifo["short_p95_s"], fifo["makespan_s"], fifo["rows_peak_mb"], "-",
          f"max_sandboxes = {args.budget_mb // args.long_mb}"],
         ["classes", ours["short_p50_s"], ours["short_p95_s"], ours["makespan_s"], ours["rows_peak_mb"],
          ours["worker_peak_mb"], f"run pool {args.run_pool}, admitted by class"]]
        + ([["uncapped", uncapped["short_p50_s"], uncapped["short_p95_s"], uncapped["makespan_s"],
             uncapped["rows_peak_mb"], "-", f"run pool {args.run_pool}, no cap (not judged)"]] if uncapped else []),
    )
    peak = max(ours["rows_peak_mb"], ours["worker_peak_mb"] or 0)
    print(f"\nshort p95, fifo / classes: {latency_gain:.2f}x (goal >= 3)")
    print(f"makespan, classes / fifo: {makespan_ratio:.3f} (goal <= 1.05)")
    print(f"peak declared memory with classes: {peak} MB of {args.budget_mb} MB (goal: never above)")
    emit_json({"short_p95_gain": round(latency_gain, 2), "makespan_ratio": round(makespan_ratio, 3),
               "peak_memory_mb": peak, "budget_memory_mb": args.budget_mb, "within_budget": peak <= args.budget_mb,
               "fifo_short_p95_s": round(fifo["short_p95_s"], 3), "classes_short_p95_s": round(ours["short_p95_s"], 3),
               "fifo_makespan_s": round(fifo["makespan_s"], 3), "classes_makespan_s": round(ours["makespan_s"], 3),
               **({"uncapped_peak_memory_mb": uncapped["rows_peak_mb"]} if uncapped else {})})


if __name__ == "__main__":
    main()
