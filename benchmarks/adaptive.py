"""The adaptive sample budget against uniform DAPO sampling, with real workers and known pass rates.

    python -m benchmarks.adaptive [--prompts 48] [--batches 80] [--informative 8] [--samples 8]

Every prompt is a `sleep` job whose reward is {"bernoulli": p} with a p the benchmark knows (the
scripted stand-in for a policy): a quarter of the prompts are never solved (p = 0), a quarter always
(p = 1), the rest spread over 0.1 .. 0.9. Both samplers need `--batches` batches of K informative
groups from the same prompts, each on its own spool and local worker:

  uniform    DynamicSampler: every prompt in turn (DAPO's dynamic sampling: zero-variance groups
             are paid for, then dropped)
  adaptive   DynamicSampler(adaptive=AdaptiveBudget(...)): a prompt's turn is skipped with the
             chance its groups are uninformative, as the groups judged so far say (never below
             the budget's floor)

Figures: informative groups per 1,000 samples paid for (goal: adaptive >= 1.5x uniform), and the
difficulty mix of the trained batches: the share of groups from hard prompts (0 < p <= 0.2) in the
batches, adaptive over uniform (the stated bound: >= 0.8, no bias against hard prompts beyond it).
The figure counts samples, not seconds: it does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, parse_args, print_table
from benchmarks.dapo import wait_for_worker
from orchestrator.app.local_launch import start_local_workers
from orchestrator.trainer import AdaptiveBudget, DynamicSampler
from orchestrator.trainer.api import Spool
from orchestrator.worker.options import WorkerOptions

SPREAD = (0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9)
HARD = 0.2
GOAL_RATIO = 1.5
MIX_BOUND = 0.8


def pass_rates(count: int) -> list[float]:
    """A quarter never solved, a quarter always, the rest over SPREAD, interleaved."""
    rates = []
    for index in range(count):
        kind = index % 4
        rates.append(0.0 if kind == 0 else 1.0 if kind == 1 else SPREAD[(index // 2) % len(SPREAD)])
    return rates


def prompts(rates: list[float]) -> list[dict[str, Any]]:
    return [{"seed": f"prompt-{index}", "reward": {"bernoulli": p}} for index, p in enumerate(rates)]


def sample(base: Path, name: str, tasks: list[dict[str, Any]], args: argparse.Namespace,
           adaptive: AdaptiveBudget | None) -> dict[str, float]:
    spool = Spool.create(base / name, **{
        "pools.init": 64, "pools.run": 32, "pools.eval": 64, "pools.max_prepared": 64,
        "shards.idle_flush_s": 0.02, "shards.max_age_s": 0.2, "leases.heartbeat_s": 1.0,
    })
    rate_of = {task["seed"]: task["reward"]["bernoulli"] for task in tasks}
    launch = start_local_workers(spool.paths, 1, WorkerOptions(runtime="local"), verbose=0)
    try:
        wait_for_worker(spool)
        sampler = DynamicSampler(spool, tasks, handler="sleep", samples=args.samples,
                                 informative_groups=args.informative, adaptive=adaptive)
        trained: list[float] = []
        for step in range(args.batches):
            batch = sampler.next_batch(policy_version=step, timeout_s=600)
            trained += [rate_of[prompt["seed"]] for prompt in batch.prompts]
        sampler.close(cancel=True)
    finally:
        launch.terminate(timeout_s=60)
    totals = sampler.totals
    paid = (totals.informative + totals.zero_variance + totals.failed_groups) * args.samples
    return {"informative": totals.informative, "samples": paid,
            "per_1000": 1000 * totals.informative / paid if paid else 0.0,
            "hard_share": sum(0 < p <= HARD for p in trained) / len(trained) if trained else 0.0,
            "mean_p": sum(trained) / len(trained) if trained else 0.0,
            "skipped": totals.skipped_prompts}


# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"prompts": 16, "batches": 4, "informative": 4, "samples": 4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--batches", type=int, default=80)
    parser.add_argument("--informative", type=int, default=8, help="K: informative groups per batch")
    parser.add_argument("--samples", type=int, default=8, help="G: samples per group")
    parser.add_argument("--floor", type=float, default=0.1, help="the budget's least admission probability")
    args = parse_args(parser, QUICK)
    tasks = prompts(pass_rates(args.prompts))
    base = Path(tempfile.mkdtemp(prefix="bench-adaptive-"))
    try:
        uniform = sample(base, "uniform", tasks, args, None)
        adaptive = sample(base, "adaptive", tasks, args, AdaptiveBudget(samples=args.samples, floor=args.floor))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ratio = adaptive["per_1000"] / uniform["per_1000"] if uniform["per_1000"] else 0.0
    mix = adaptive["hard_share"] / uniform["hard_share"] if uniform["hard_share"] else 0.0
    print_table(
        f"{args.batches} batches of {args.informative} informative groups x {args.samples} samples, "
        f"{args.prompts} prompts (1/4 never solved, 1/4 always, the rest p in {SPREAD})",
        ["sampler", "informative / 1000 samples", "samples paid", f"hard (p<={HARD}) share of batches",
         "mean p trained", "turns skipped"],
        [["uniform DAPO", uniform["per_1000"], uniform["samples"], uniform["hard_share"], uniform["mean_p"], 0],
         ["adaptive (ours)", adaptive["per_1000"], adaptive["samples"], adaptive["hard_share"], adaptive["mean_p"],
          adaptive["skipped"]]],
    )
    print(f"\n  informative groups per sample: adaptive / uniform = {ratio:.2f}x (goal >= {GOAL_RATIO}x); "
          f"hard prompts' share of the batches: adaptive / uniform = {mix:.2f} (bound >= {MIX_BOUND})")
    emit_json({"informative_per_sample_vs_uniform": round(ratio, 2), "hard_share_vs_uniform": round(mix, 2),
               "uniform_per_1000": round(uniform["per_1000"], 1), "adaptive_per_1000": round(adaptive["per_1000"], 1)})


if __name__ == "__main__":
    main()
