"""Async dynamic sampling vs batch-by-batch dynamic sampling, with real workers and a seeded handler.

    python -m benchmarks.dapo [--batches 5] [--informative 8] [--samples 4] [--slots 16]

Jobs are `sleep` jobs: RUN takes a seeded heavy-tailed time (lognormal, mean 0.4 s, 10% of them
8x longer), and half of the prompts have a constant reward (0 or 1 for every sample: groups
without GRPO signal). Both methods need `--batches` batches of K informative groups, from the
same prompts, on the same worker (one local process, `--slots` RUN slots):

  batch-by-batch   submit a generation batch of ceil(K / informative rate) groups, wait for the
                   whole batch, keep its informative groups, submit another batch while fewer
                   than K (DAPO's dynamic sampling as first published; extra groups are dropped)
  ours             DynamicSampler: groups kept in flight, judged as they complete, refilled at
                   once, the batch returned at the K-th informative group, leftovers carried

Figures: speedup_vs_batch = baseline seconds / ours for the same number of batches (the
argument of ProRL's Fig. 3, measured), worker_idle_share = share of RUN slot-seconds idle
while ours ran, filtered_share.
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, parse_args, print_table
from orchestrator.trainer.api import Spool
from orchestrator.app.local_launch import start_local_workers
from orchestrator.report.status import pending_count
from orchestrator.trainer import DynamicSampler
from orchestrator.worker.options import WorkerOptions

ZERO_VARIANCE_SHARE = 0.5
RUN = {"lognormal": {"mean": 0.4, "sigma": 0.5}, "tail_p": 0.1, "tail_factor": 8}


def prompts(count: int) -> list[dict[str, Any]]:
    rewards = []
    for index in range(count):
        constant = (index * 7919) % 100 < ZERO_VARIANCE_SHARE * 100
        rewards.append({"bernoulli": float(index % 2)} if constant else {"bernoulli": 0.5})
    return [{"run": RUN, "seed": index, "reward": reward} for index, reward in enumerate(rewards)]


def new_spool(base: Path, name: str, slots: int) -> Spool:
    return Spool.create(base / name, **{
        "pools.init": slots * 4, "pools.run": slots, "pools.eval": slots * 4, "pools.max_prepared": slots * 4,
        "shards.idle_flush_s": 0.02, "shards.max_age_s": 0.2, "leases.heartbeat_s": 1.0,
    })


def wait_for_worker(spool: Spool) -> None:
    deadline = time.monotonic() + 60
    while not list(spool.paths.workers.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)


def batch_by_batch(spool: Spool, tasks: list[dict[str, Any]], batches: int, informative: int, samples: int) -> dict[str, float]:
    generation = math.ceil(informative / (1 - ZERO_VARIANCE_SHARE))
    reader = spool.reader(poll_s=0.02)
    cursor, rounds = 0, 0
    started = time.monotonic()
    for _ in range(batches):
        kept = 0
        while kept < informative:
            chunk = [tasks[(cursor + i) % len(tasks)] for i in range(generation)]
            cursor += generation
            rounds += 1
            spool.submit(chunk, handler="sleep", samples=samples)
            for _ in range(generation):             # the whole generation batch, stragglers included
                group = reader.next_group(300)
                assert group is not None, "a generation batch never completed"
                kept += len({r["reward"] for r in group}) > 1
    return {"seconds": time.monotonic() - started, "rounds": rounds}


def ours(spool: Spool, tasks: list[dict[str, Any]], batches: int, informative: int, samples: int) -> dict[str, float]:
    sampler = DynamicSampler(spool, tasks, handler="sleep", samples=samples, informative_groups=informative)
    started, wall_start = time.monotonic(), time.time()
    for step in range(batches):
        batch = sampler.next_batch(policy_version=step, timeout_s=600)
        assert len(batch.groups) == informative
    seconds = time.monotonic() - started
    window = (wall_start, wall_start + seconds)
    sampler.close(cancel=False)
    return {"seconds": seconds, "window": window, "filtered_share": sampler.totals.filtered_share,
            "submitted": sampler.totals.submitted_groups}


def idle_share(spool: Spool, window: tuple[float, float], slots: int) -> float:
    """RUN slot-seconds not used inside the window, from the rows' RUN start and end times."""
    deadline = time.monotonic() + 300
    while pending_count(spool.paths) and time.monotonic() < deadline:   # carried jobs finish: their rows count
        time.sleep(0.1)
    time.sleep(0.5)
    start, end = window
    busy = 0.0
    for row in spool.reader(columns=("run_started_at", "run_ended_at")).rows():
        if row["run_started_at"] is None or row["run_ended_at"] is None:
            continue
        begun, ended = row["run_started_at"].timestamp(), row["run_ended_at"].timestamp()
        busy += max(0.0, min(ended, end) - max(begun, start))
    return max(0.0, 1.0 - busy / (slots * (end - start)))


def run(base: Path, name: str, slots: int, method: Any, args: argparse.Namespace) -> tuple[Spool, dict[str, float]]:
    spool = new_spool(base, name, slots)
    launch = start_local_workers(spool.paths, 1, WorkerOptions(runtime="local"), verbose=0)
    try:
        wait_for_worker(spool)
        figures = method(spool, prompts(200), args.batches, args.informative, args.samples)
        if "window" in figures:
            figures["idle"] = idle_share(spool, figures["window"], slots)
    finally:
        launch.terminate(timeout_s=60)
    return spool, figures


# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"batches": 1, "informative": 2, "samples": 2, "slots": 4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--informative", type=int, default=8, help="K: informative groups per batch")
    parser.add_argument("--samples", type=int, default=4, help="G: samples per group")
    parser.add_argument("--slots", type=int, default=16, help="RUN slots of the worker")
    args = parse_args(parser, QUICK)
    base = Path(tempfile.mkdtemp(prefix="bench-dapo-"))
    try:
        _, baseline = run(base, "batch", args.slots, batch_by_batch, args)
        _, async_ = run(base, "async", args.slots, ours, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    speedup = baseline["seconds"] / async_["seconds"]
    print_table(
        f"{args.batches} batches of {args.informative} informative groups x {args.samples} samples, "
        f"{args.slots} RUN slots, {ZERO_VARIANCE_SHARE:.0%} constant-reward prompts, heavy-tailed RUN",
        ["method", "seconds", "s per batch", "notes"],
        [["batch-by-batch", baseline["seconds"], baseline["seconds"] / args.batches, f"{baseline['rounds']:.0f} generation rounds"],
         ["async (ours)", async_["seconds"], async_["seconds"] / args.batches,
          f"idle {async_['idle']:.1%}, filtered {async_['filtered_share']:.1%}, {async_['submitted']:.0f} groups submitted"]],
    )
    emit_json({"speedup_vs_batch": round(speedup, 2), "worker_idle_share": round(async_["idle"], 3),
               "filtered_share": round(async_["filtered_share"], 3),
               "baseline_s": round(baseline["seconds"], 2), "ours_s": round(async_["seconds"], 2)})


if __name__ == "__main__":
    main()
