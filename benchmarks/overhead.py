"""Engine overhead: echo jobs through all three stages with local workers on local disk.

    python -m benchmarks.overhead [--jobs 2000] [--workers 4] [--queued 100000]

Figures: jobs/s end to end (target >= 500), filesystem metadata operations per job (target
<= 15), claim latency with 100 vs 100,000 jobs queued (target ratio <= 2), and the time to
submit 100,000 jobs (target: well under a minute).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson

from benchmarks.common import emit_json, median, parse_args, percentile, print_table, submit_all
from orchestrator.spool import fsops
from orchestrator.spool.claims import Claimer
from orchestrator.app.local_launch import start_local_workers
from orchestrator.spool.rundir import init_run
from orchestrator.report.status import pending_count
from orchestrator.worker.options import WorkerOptions

ECHO_ROW = {"handler": "echo", "instance": {"x": 1}}


def echo_rows(count: int) -> list[tuple[int, dict]]:
    return [(i + 1, ECHO_ROW) for i in range(count)]


def end_to_end(base: Path, jobs: int, workers: int) -> dict[str, float]:
    paths, _ = init_run(base / "e2e", {"leases.heartbeat_s": 1.0, "shards.idle_flush_s": 0.2})
    launch = start_local_workers(paths, workers, WorkerOptions(), verbose=0)
    try:
        deadline = time.monotonic() + 60
        while len(fsops.list_names(paths.workers)) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
        before = Counter(fsops.OPS)
        started = time.perf_counter()
        submit_all(paths, echo_rows(jobs))
        submit_ops = Counter(fsops.OPS)
        submit_ops.subtract(before)
        while pending_count(paths) > 0:
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
    finally:
        launch.terminate(timeout_s=30)
    worker_ops: Counter[str] = Counter()
    for heartbeat in (paths.workers / "gone").glob("*.json"):
        worker_ops.update(orjson.loads(heartbeat.read_bytes()).get("fs_ops", {}))
    total = worker_ops + Counter({k: v for k, v in submit_ops.items() if v > 0})
    return {
        "jobs": jobs, "seconds": elapsed, "jobs_per_s": jobs / elapsed,
        "metadata_ops_per_job": sum(total.values()) / jobs,
        **{f"ops_{kind}_per_job": count / jobs for kind, count in sorted(total.items())},
    }


def claim_latency(base: Path, queued: int, claims: int = 500) -> dict[str, float]:
    """Claims from a queue of `queued` single tickets: a claim's cost may grow only with the
    entries of the queue, so each job is an entry here (batch size 1; batches divide the entries)."""
    paths, _ = init_run(base / f"claims-{queued}")
    started = time.perf_counter()
    submit_all(paths, echo_rows(queued), batch_size=1)
    submit_s = time.perf_counter() - started
    claim_dir = paths.claims("bench")
    claim_dir.mkdir(parents=True, exist_ok=True)
    claimer = Claimer(paths.init_queue, claim_dir)
    latencies = []
    for _ in range(min(claims, queued)):
        t0 = time.perf_counter()
        assert claimer.claim() is not None
        latencies.append(time.perf_counter() - t0)
    return {
        "queued": queued, "submit_s": submit_s, "first_claim_ms": latencies[0] * 1e3,
        "median_ms": median(latencies) * 1e3, "p99_ms": percentile(latencies, 0.99) * 1e3,
        "mean_ms": sum(latencies) / len(latencies) * 1e3,
    }


# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"jobs": 40, "workers": 2, "queued": 500}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, default=None, help="Where to put the run directories (local disk).")
    args = parse_args(parser, QUICK)
    base = Path(tempfile.mkdtemp(prefix="hpc-rollout-bench-", dir=args.dir))
    try:
        e2e = end_to_end(base, args.jobs, args.workers)
        small = claim_latency(base, 100)
        large = claim_latency(base, args.queued)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ratio = large["median_ms"] / small["median_ms"]
    print_table(f"{args.jobs} echo jobs, {args.workers} local workers", ["figure", "measured", "target"], [
        ["jobs/s end to end", e2e["jobs_per_s"], ">= 500"],
        ["metadata ops per job", e2e["metadata_ops_per_job"], "<= 15"],
        *[[f"  {k[4:-8]} per job", v, ""] for k, v in e2e.items() if k.startswith("ops_")],
    ])
    print_table("claim latency", ["jobs queued", "median ms", "p99 ms", "mean ms", "first claim ms", "submit s"], [
        [r["queued"], r["median_ms"], r["p99_ms"], r["mean_ms"], r["first_claim_ms"], r["submit_s"]] for r in (small, large)
    ])
    print(f"\n  claim latency ratio {args.queued} vs 100 queued: {ratio:.2f} (target <= 2)")
    print(f"  submitting {args.queued} jobs took {large['submit_s']:.1f} s (target: well under 60 s)")
    emit_json({
        "jobs_per_s": round(e2e["jobs_per_s"], 1),
        "metadata_ops_per_job": round(e2e["metadata_ops_per_job"], 2),
        "claim_latency_ratio": round(ratio, 2),
        "submit_s": round(large["submit_s"], 2), "queued": args.queued,
    })


if __name__ == "__main__":
    main()
