"""What one job costs the metadata server at the pipeline benchmark's job mix, by duty.

    python -m benchmarks.job_ops [--jobs 400] [--scale 0.05] [--batch-sizes 1,8]

Each batch size (jobs.batch_size: jobs per queue/init/ entry) is measured in turn, in one run;
the JSON line carries the figures of the last (run.toml's default, 8) and, per duty, the ratio
of the first to it (`*_ratio_b1_over_b8`).

The pipeline benchmark's workload (the `sleep` handler: INIT 1-3 s, RUN 2-10 s, EVAL lognormal
mean 3 s with a 10% tail ten times longer, every duration times --scale) runs through one real
worker process with its pools (INIT 4, RUN 8, EVAL 8, at most 4 prepared, 12 sandboxes), among
20 simulated live workers, so that it polls as on a large run.
fsops charges every operation to the duty that made it (orchestrator/spool/fsops.py, `duty`):

- per job: submit (this process), claim (won claims, their lost races and listings), job (the
  stage steps: ticket reads, saves, hand-offs) and commit (shards, ticket unlinks); the data
  flushes of journal appends (a RUN output kept for this worker's own EVAL) are reported
  apart as `job_data_flushes_per_job`: they reach the data servers, not the metadata server;
- per second of a worker: idle polls (claims that found nothing) and backpressure (the run
  queue listed while INIT waits for room); they depend on wall time, not on the job count;
- periodic duties (heartbeat, recovery, cancel and stop polls, claim audit) are reported but
  modelled per call by benchmarks.scale, never charged to jobs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson

from benchmarks.common import emit_json, parse_args, print_table, submit_all
from benchmarks.pipeline import RUN_SLOTS, SANDBOXES, profile
from orchestrator.spool import fsops
from orchestrator.app.local_launch import start_local_workers
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run
from orchestrator.report.status import pending_count
from orchestrator.spool.cluster_summary import LARGE_RUN_WORKERS
from orchestrator.worker.options import WorkerOptions

NAMES_PER_OP = 1000   # one more operation per this many names a listing returns
PER_JOB_DUTIES = ("submit", "claim", fsops.JOB_DUTY, "commit")
PER_SECOND_DUTIES = ("idle_poll", "backpressure")
PERIODIC_DUTIES = ("heartbeat", "recovery", "cancel_poll", "stop_poll", "claim_audit", "idle_exit", "sandbox_sweep",
                   "access_check")


def charged(by_duty: Counter[str], duty: str) -> float:
    """Operations of one duty, its listings charged one more per 1,000 names returned."""
    return by_duty[duty] + by_duty[f"{duty}:names"] / NAMES_PER_OP


def keep_alive(paths: SpoolPaths, peers: int) -> None:
    """`peers` live heartbeats of simulated workers: the real worker behaves as on a large run."""
    for index in range(peers):
        heartbeat = paths.heartbeat(f"peer{index:03d}-1-beef")
        if heartbeat.exists():
            os.utime(heartbeat)
        else:
            heartbeat.write_bytes(orjson.dumps({"node": f"peer{index:03d}", "state": "running"}))


def worker_counts(paths: SpoolPaths, pattern: str) -> Counter[str]:
    """The fsops counts by duty in the real workers' heartbeats matching `pattern`."""
    counts: Counter[str] = Counter()
    for heartbeat in paths.workers.glob(f"{pattern}.json"):
        if not heartbeat.name.startswith("peer"):
            counts.update(orjson.loads(heartbeat.read_bytes()).get("fs_ops_by_duty", {}))
    return counts


def pipeline_mix(base: Path, jobs: int, scale: float, peers: int = LARGE_RUN_WORKERS + 4,
                 batch_size: int | None = None) -> dict[str, float]:
    """Per-job and per-second metadata operations of the pipeline mix through one real worker
    that sees `peers` other live workers (a large run, with its poll periods, once its first
    recovery scan has counted them: every lease/3 = 2 s here)."""
    settings: dict[str, float] = {"shards.idle_flush_s": 0.2, "leases.heartbeat_s": 2.0, "leases.lease_s": 6.0}
    if batch_size is not None:
        settings["jobs.batch_size"] = batch_size
    paths, config = init_run(base / f"job-ops-x{scale:g}-b{batch_size or 'default'}", settings)
    keep_alive(paths, peers)
    options = WorkerOptions(init_pool=4, run_pool=RUN_SLOTS, eval_pool=8, max_prepared=4, max_sandboxes=SANDBOXES)
    launch = start_local_workers(paths, 1, options, verbose=0)
    try:
        deadline = time.monotonic() + 60
        while len(fsops.list_names(paths.workers)) <= peers and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.5)   # its first recovery scan has seen the peers
        # what the worker did before the jobs came (starting, polling as a small run) is not
        # theirs: its last heartbeat's counts are taken off (up to a beat of idle polls stays in)
        by_duty = Counter({k: -v for k, v in worker_counts(paths, "*").items()})
        before = Counter(fsops.BY_DUTY)
        started = time.monotonic()
        with fsops.duty("submit"):
            submit_all(paths, [(i + 1, {"handler": "sleep", "instance": profile(scale)}) for i in range(jobs)])
        by_duty.update(fsops.BY_DUTY)
        by_duty.subtract(before)
        while pending_count(paths) > 0:
            keep_alive(paths, peers)
            time.sleep(0.05)
        seconds = time.monotonic() - started
    finally:
        launch.terminate(timeout_s=30)
    by_duty.update(worker_counts(paths, "gone/*"))
    figures: dict[str, float] = {"jobs": jobs, "seconds": seconds, "batch_size": config.jobs.batch_size}
    for duty in PER_JOB_DUTIES:
        figures[f"{duty}_per_job"] = charged(by_duty, duty) / jobs
    figures["per_job"] = sum(figures[f"{d}_per_job"] for d in PER_JOB_DUTIES)
    figures["job_data_flushes_per_job"] = by_duty[f"{fsops.JOB_DUTY}:data"] / jobs
    for duty in PER_SECOND_DUTIES + PERIODIC_DUTIES:
        figures[f"{duty}_per_s"] = charged(by_duty, duty) / seconds
    figures["per_worker_second"] = sum(figures[f"{d}_per_s"] for d in PER_SECOND_DUTIES)
    return figures


# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"jobs": 16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--scale", type=float, default=0.05, help="multiplies every stage duration")
    parser.add_argument("--batch-sizes", default="1,8", help="jobs per queue/init entry, measured in turn")
    args = parse_args(parser, QUICK)
    sizes = [int(size) for size in args.batch_sizes.split(",")]
    base = Path(tempfile.mkdtemp(prefix="bench-job-ops-"))
    try:
        mixes = {size: pipeline_mix(base, args.jobs, args.scale, batch_size=size) for size in sizes}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print_table(f"{args.jobs} sleep jobs (pipeline mix x{args.scale}), one worker, by batch size", ["duty", *map(str, sizes)],
                [[k, *(mixes[size][k] for size in sizes)] for k in mixes[sizes[-1]]])
    result = {k: round(v, 3) for k, v in mixes[sizes[-1]].items()}
    if len(sizes) > 1:
        first, last = mixes[sizes[0]], mixes[sizes[-1]]
        for key in [f"{d}_per_job" for d in PER_JOB_DUTIES] + ["per_job"]:
            result[f"{key}_b{sizes[0]}"] = round(first[key], 3)
            result[f"{key}_ratio_b{sizes[0]}_over_b{sizes[-1]}"] = round(first[key] / last[key], 2) if last[key] else 0.0
    emit_json(result)


if __name__ == "__main__":
    main()
