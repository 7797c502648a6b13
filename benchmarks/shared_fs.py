"""The spool on a local disk and on the NFS-like rig, side by side in one run.

    python -m benchmarks.shared_fs [--jobs 120] [--workers 3]

Each side runs the same workload: `--jobs` sleep jobs through `--workers` real workers (on the
rig each worker is a node of its own, at a Linux NFS client's default cache times: acregmin 3 s,
acdirmin 30 s, close-to-open; tests/fsrig), one of them SIGKILLed half-way, then a cancel and a
stop written by another node (on the rig: one more node). Printed per side:

  lost / duplicated   jobs without a row / with more than one (goal 0 / 0)
  fenced              lease_lost events of workers that were never paused (goal 0)
  cancel_s, stop_s    from the request being on the server to the row `cancelled` / the workers
                      gone (goal: within the bound docs/robustness.md states, 4 s + the grace)
  ops_per_job         metadata operations per job charged to jobs (submit, claims, stage steps,
                      commits), from the workers' heartbeats (goal: at most 1.2x the local figure)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, parse_args, print_table
from benchmarks.job_ops import PER_JOB_DUTIES, charged, worker_counts
from orchestrator.report.status import pending_count
from orchestrator.spool import fsops
from orchestrator.spool.events import events_named
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run
from orchestrator.spool.shard_reader import iter_rows
from orchestrator.submission.submit import submit_rows
from tests.fsrig.rig import NFS_DEFAULTS, REPO, Rig, start_worker as start_rig_worker

REQUIRES = ("fuse",)
SETTINGS = {"leases.heartbeat_s": 1.0, "leases.lease_s": 10.0, "shards.idle_flush_s": 0.2, "shards.max_age_s": 1.0,
            "shutdown.grace_s": 5.0}
CLI = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
QUICK = {"jobs": 24, "workers": 2}


def start_local_worker(paths: SpoolPaths) -> subprocess.Popen[bytes]:
    log = open(paths.root / f"worker-{time.monotonic_ns()}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "orchestrator.worker", str(paths.root), "-v"], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmarks.shared_fs: timed out waiting for {what}")
        time.sleep(0.05)


def one_side(base: Path, rig: Rig | None, jobs: int, workers: int) -> dict[str, float]:
    """The workload on a local run (rig None) or on the rig; its figures."""
    paths, _ = init_run(base / "run", SETTINGS)

    def command(*args: str) -> None:   # a CLI command, on the rig as a node of its own
        argv = [*CLI, *args[:1], str(rig.seen_from_node(paths.root)) if rig else str(paths.root), *args[1:]]
        subprocess.run(rig.node(argv) if rig else argv, cwd=REPO, check=True, capture_output=True, timeout=120)

    def start() -> subprocess.Popen[bytes]:
        return start_rig_worker(rig, paths.root) if rig else start_local_worker(paths)

    before = fsops.BY_DUTY["submit"] + fsops.BY_DUTY["submit:names"] / 1000
    with fsops.duty("submit"):
        report = submit_rows(paths, [(n, {"handler": "sleep", "instance": {"run": 0.3}}) for n in range(jobs)])
    submit_ops = charged(fsops.BY_DUTY, "submit") - before
    running = [start() for _ in range(workers)]
    try:
        wait_for(lambda: sum(len(rows) for _, rows in iter_rows(paths)) >= jobs // 2, 300, "half the rows")
        os.killpg(running[0].pid, signal.SIGKILL)   # its claims come back after the lease
        running[0].wait()
        running.append(start())
        wait_for(lambda: pending_count(paths) == 0, 600, "the queues to drain")
        slow = submit_rows(paths, [(1, {"handler": "sleep", "instance": {"run": 300}})]).first_job
        wait_for(lambda: any(p.name == slow for d in paths.active.iterdir() if d.is_dir() for p in d.iterdir()),
                 120, "the slow job to be claimed")
        command("cancel", slow)
        asked = time.monotonic()
        wait_for(lambda: any(r["job_id"] == slow and r["status"] == "cancelled"
                             for _, rows in iter_rows(paths) for r in rows), 120, "the cancelled row")
        cancel_s = time.monotonic() - asked
        command("stop", "--no-wait")
        asked = time.monotonic()
        for process in running[1:]:
            process.wait(timeout=120)
        stop_s = time.monotonic() - asked
    finally:
        for process in running:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    counts = Counter(r["job_id"] for _, rows in iter_rows(paths) for r in rows)
    prefix = report.first_job.rsplit("-", 2)[0]
    expected = {f"{prefix}-{n:07d}-0000" for n in range(jobs)}
    by_duty = worker_counts(paths, "*") + worker_counts(paths, "gone/*")
    per_job = (submit_ops + sum(charged(by_duty, d) for d in PER_JOB_DUTIES if d != "submit")) / jobs
    return {"lost": len(expected - set(counts)), "duplicated": sum(1 for j in expected if counts[j] > 1),
            "fenced": len(events_named(paths, "lease_lost")), "cancel_s": round(cancel_s, 2),
            "stop_s": round(stop_s, 2), "ops_per_job": round(per_job, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=120)
    parser.add_argument("--workers", type=int, default=3)
    args = parse_args(parser, QUICK)
    base = Path(tempfile.mkdtemp(prefix="hpcr-sharedfs-"))
    try:
        local = one_side(base / "local", None, args.jobs, args.workers)
        (base / "server").mkdir()
        (base / "view").mkdir()
        nfs = one_side(base / "server", Rig(base / "server", base / "view", NFS_DEFAULTS), args.jobs, args.workers)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = [[name, local[name], nfs[name]] for name in local]
    print_table(f"{args.jobs} jobs, {args.workers} workers (one SIGKILLed), local disk vs the NFS rig (defaults)",
                ["figure", "local", "nfs rig"], rows)
    figures: dict[str, Any] = {f"local_{k}": v for k, v in local.items()} | {f"nfs_{k}": v for k, v in nfs.items()}
    figures["ops_per_job_ratio_nfs_over_local"] = round(nfs["ops_per_job"] / local["ops_per_job"], 3)
    emit_json(figures)


if __name__ == "__main__":
    main()
