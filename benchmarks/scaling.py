"""Throughput of node workers launched as a Slurm array, with 1, 2 and 4 emulated nodes.

    python -m benchmarks.scaling [--run-s 2.0] [--waves 12] [--pool 8] [--nodes 1,2,4]

Needs the real cluster (`sudo SLURM_NODES=4 scripts/slurm-up.sh`). Workload: `sleep` jobs
(RUN = --run-s seconds, INIT/EVAL instant), --waves x --pool jobs per node so every size runs
about as long. Each size gets a fresh run directory and one `launch --nodes N` array through
the same API the CLI uses; the workers are drained and the array is gone before the next size.

Figures per size:
- launch -> first claim: from calling launch() to the first INIT claim in the spool's events
  (sbatch, scheduling, Python start-up, first heartbeat);
- throughput: jobs / (last finish - first claim), end to end: the array's ramp-up (tasks
  starting on different nodes) and the last partial wave count against it;
- steady jobs/s: over the middle of the run (10th to 90th percentile of finish times), shown
  for reference (sleep jobs finish in waves, so this one can exceed pool/run_s slightly).
Target: ratio_4_to_1 >= 3.6 (near-linear scaling), computed end to end. The last line is one
JSON object; its launch_to_first_claim_s is the 4-node launch's (the largest size measured).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, parse_args, print_table, submit_all
from orchestrator.spool.launches import request_stop
from orchestrator.spool.paths import SpoolPaths
from orchestrator.slurm.cluster import slurm_available
from orchestrator.slurm.launcher import launch
from orchestrator.slurm.options import LaunchOptions
from orchestrator.slurm.queries import cancel, still_queued
from orchestrator.spool.rundir import init_run
from orchestrator.spool.events import events_named
from orchestrator.report.status import pending_count
from orchestrator.worker.options import WorkerOptions

RUN_SETTINGS = {"leases.heartbeat_s": 1.0, "leases.lease_s": 30.0, "shards.idle_flush_s": 0.5}


def event_times(paths: SpoolPaths, kind: str) -> list[float]:
    return sorted(float(record["t"]) for record in events_named(paths, kind))


def wait_gone(array_id: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while still_queued([array_id]) and time.monotonic() < deadline:
        time.sleep(0.5)
    if still_queued([array_id]):
        cancel([array_id])
        while still_queued([array_id]):
            time.sleep(0.5)


def measure(root: Path, nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    paths, _ = init_run(root / f"nodes-{nodes}", RUN_SETTINGS)
    jobs = nodes * args.waves * args.pool
    row = {"handler": "sleep", "instance": {"run": args.run_s}}
    submit_all(paths, ((i, row) for i in range(jobs)))
    worker = WorkerOptions(init_pool=args.pool, run_pool=args.pool, eval_pool=args.pool, max_prepared=args.pool)
    started = time.time()
    result = launch(paths.root, LaunchOptions(nodes=nodes, time="00:30:00", job_name="bench-scaling"), worker)
    array_id = result.array_ids[0]
    try:
        deadline = time.monotonic() + args.timeout_s
        while pending_count(paths) and time.monotonic() < deadline:
            time.sleep(0.5)
        if pending_count(paths):
            raise RuntimeError(f"{nodes} node(s): {pending_count(paths)} jobs still pending after {args.timeout_s}s")
    finally:
        request_stop(paths)
        wait_gone(array_id, 60)
    claims = event_times(paths, "init_started")
    finishes = event_times(paths, "finished")
    lo, hi = finishes[int(0.1 * len(finishes))], finishes[int(0.9 * len(finishes)) - 1]
    steady = (int(0.9 * len(finishes)) - int(0.1 * len(finishes)) - 1) / max(hi - lo, 1e-9)
    return {
        "nodes": nodes, "jobs": len(finishes), "array": array_id,
        "launch_to_first_claim_s": claims[0] - started,
        "throughput": len(finishes) / max(finishes[-1] - claims[0], 1e-9),
        "steady": steady,
    }


REQUIRES = ("slurm",)   # what tests/test_benchmarks.py checks for before running it
# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"nodes": "1,2", "waves": 1, "pool": 1, "run_s": 0.2, "timeout_s": 120.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-s", type=float, default=2.0, help="RUN seconds of each sleep job")
    parser.add_argument("--waves", type=int, default=12, help="jobs per RUN slot and node")
    parser.add_argument("--pool", type=int, default=8, help="INIT/RUN/EVAL slots per node worker")
    parser.add_argument("--nodes", default="1,2,4", help="array sizes to measure")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parse_args(parser, QUICK)
    if not slurm_available() or subprocess.run(["scontrol", "ping"], capture_output=True).returncode:
        print("no Slurm cluster here: start one with `sudo SLURM_NODES=4 scripts/slurm-up.sh`")
        emit_json({"ratio_4_to_1": None, "launch_to_first_claim_s": None, "error": "no slurm"})
        raise SystemExit(2)
    root = Path(tempfile.mkdtemp(prefix="bench-scaling-", dir=Path.cwd() if args.keep else None))
    sizes = [int(n) for n in args.nodes.split(",")]
    results = []
    try:
        for nodes in sizes:
            results.append(measure(root, nodes, args))
            print(f"  {nodes} node(s): {results[-1]['throughput']:.2f} jobs/s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    base = results[0]["throughput"]
    print_table(
        f"sleep jobs (RUN {args.run_s:g}s, {args.pool} slots/node, {args.waves} waves/node) on the real cluster",
        ["nodes", "jobs", "array", "launch->1st claim s", "jobs/s", "jobs/s per node", "speed-up",
         "steady jobs/s"],
        [[r["nodes"], r["jobs"], r["array"], r["launch_to_first_claim_s"], r["throughput"],
          r["throughput"] / r["nodes"], r["throughput"] / base, r["steady"]] for r in results],
    )
    by_nodes = {r["nodes"]: r for r in results}
    ratio = by_nodes[4]["throughput"] / by_nodes[1]["throughput"] if {1, 4} <= set(by_nodes) else None
    print(f"\nratio 4/1 nodes: {ratio:.2f} (target >= 3.6)" if ratio else "")
    emit_json({
        "ratio_4_to_1": round(ratio, 3) if ratio else None,
        "launch_to_first_claim_s": round(results[-1]["launch_to_first_claim_s"], 3),
        "launch_to_first_claim_s_by_nodes": {str(r["nodes"]): round(r["launch_to_first_claim_s"], 3) for r in results},
        "throughput_by_nodes": {str(r["nodes"]): round(r["throughput"], 3) for r in results},
        "ideal_per_node": round(args.pool / args.run_s, 3),
    })


if __name__ == "__main__":
    main()
