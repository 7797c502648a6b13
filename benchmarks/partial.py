"""Partial rollouts vs restarts: the tokens a weight swap throws away, side by side.

    python -m benchmarks.partial [--quick] [--groups 16] [--samples 4] [--turns 8] [--span 1.2]

The same workload twice, once per staleness mode: chat episodes of --turns turns (a fixed number
of tokens per turn: ignore_eos), --groups x --samples of them, on one `serve-llm --tiny` (a real
model) through a real local worker with --slots RUN slots; a trainer (DynamicSampler, lag bound
1, every complete group taken) while the weights are swapped with a real reload. Swaps are paced
by progress, one every (turns x slots / --span) generations the server completes, so an episode
lasts about --span swap periods whatever the machine's speed (1.2: about a fifth of the episodes
see two swaps, the case the lag bound is for); the swap period in seconds and the episode's
duration are measured and printed.

    restart   a job whose first turns are two versions old is cancelled; its group is submitted again
    continue  the job goes on; the trainer masks the tokens of turns older than the bound
              (aborted generations resume on the new weights: swap_weights(abort=True))

Every token the server sampled is counted from its record; a token is trained when it is in a
batch with loss mask 1. wasted_token_share = 1 - trained / sampled (target for continue: <= 0.05);
tokens_per_trained_token_ratio = (sampled / trained) of restart over that of continue.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, parse_args, print_table
from orchestrator.app.local_launch import start_local_workers
from orchestrator.devserver.local_server import start_server
from orchestrator.devserver.tiny_model import save_perturbed_copy, tiny_model_dir
from orchestrator.llm.registry import BackendRegistry
from orchestrator.trainer import DynamicSampler
from orchestrator.trainer.api import Spool
from orchestrator.worker.options import WorkerOptions

LAG = 1
SETTINGS = {"leases.heartbeat_s": 0.5, "leases.lease_s": 5.0, "shards.idle_flush_s": 0.05, "shards.max_age_s": 0.2}


def prompts(count: int, turns: int) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": f"Tell me about the number {n}."}],
             "user_turns": [f"And then, part {t}?" for t in range(turns - 1)]} for n in range(count)]


def sampled_tokens(record: Path, skip: int) -> tuple[int, int]:
    """(tokens sampled by the server after its first `skip` generations, generations so far).

    Whole lines only: the server may be writing the last one (a torn line once raised here and
    ended the swap thread, and every later swap with it)."""
    text = record.read_text()
    lines = text[: text.rfind("\n") + 1].splitlines()
    return sum(len(json.loads(line)["output_ids"]) for line in lines[skip:]), len(lines)


class Swapper:
    """Swaps the weights (two checkpoints alternate) each time the server has completed `every`
    more generations (its record file), until stopped."""

    def __init__(self, spool: Spool, checkpoints: list[Path], record: Path, every: int, abort: bool) -> None:
        self.spool, self.checkpoints, self.record, self.every, self.abort = spool, checkpoints, record, every, abort
        self.version, self.at = 0, [time.monotonic()]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        _, seen = sampled_tokens(self.record, 0)
        while not self.stop.wait(0.05):
            _, now = sampled_tokens(self.record, 0)
            if now - seen < self.every:
                continue
            seen = now
            self.spool.swap_weights(self.checkpoints[self.version % 2], version=self.version + 1,
                                    max_policy_lag=LAG, abort=self.abort)
            self.version += 1
            self.at.append(time.monotonic())

    def period_s(self) -> float:
        gaps = [b - a for a, b in zip(self.at[1:], self.at[2:])]
        return statistics.median(gaps) if gaps else float("nan")

    def __enter__(self) -> "Swapper":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(120)


def workload(base: Path, name: str, url: str, slots: int) -> Spool:
    spool = Spool.create(base / name, **SETTINGS, **{"pools.run": slots, "trainer.max_policy_lag": LAG})
    BackendRegistry(spool.paths).add(url, version=0)
    return spool


def episode_seconds(spool: Spool) -> float:
    """Median seconds from an episode's first request to its last answer (a fresh worker's setup,
    its first tokenizer load, is not part of an episode)."""
    spans = [r["turns"][-1]["sent_at"] + r["turns"][-1]["latency_s"] - r["turns"][0]["sent_at"]
             for r in spool.reader(columns=("turns", "status")).rows() if r["turns"] and r["status"] == "ok"]
    return statistics.median(spans) if spans else float("nan")


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_tokens": args.tokens, "ignore_eos": True, "temperature": 1.0}


def run_mode(base: Path, mode: str, url: str, record: Path, checkpoints: list[Path],
             args: argparse.Namespace) -> dict[str, Any]:
    spool = workload(base, mode, url, args.slots)
    _, before = sampled_tokens(record, 0)
    launch = start_local_workers(spool.paths, 1, WorkerOptions(runtime="local"), verbose=0)
    trained = groups = 0
    started = time.monotonic()
    try:
        sampler = DynamicSampler(spool, iter(prompts(args.groups, args.turns)), handler="chat", samples=args.samples,
                                 informative_groups=1, drop_zero_variance=False, in_flight=args.groups,
                                 sampling=sampling(args), max_policy_lag=LAG, staleness=mode)
        every = max(1, round(args.turns * args.slots / args.span))
        with Swapper(spool, checkpoints, record, every, abort=mode == "continue") as swapper:
            while True:
                batch = sampler.next_batch(policy_version=swapper.version, timeout_s=900)
                if not batch.groups:
                    break
                trained += int(batch.batch.arrays["response_mask"].sum())
                groups += len(batch.groups)
        sampler.close(cancel=True)
    finally:
        launch.terminate(timeout_s=60)
    wall = time.monotonic() - started
    sampled, _ = sampled_tokens(record, before)
    totals = sampler.totals
    return {"mode": mode, "sampled": sampled, "trained": trained, "groups": groups, "wall_s": wall,
            "swaps": swapper.version, "swap_every_s": swapper.period_s(), "episode_s": episode_seconds(spool),
            "stale_groups": totals.stale_groups, "stale_rows": totals.stale_rows,
            "stale_turn_tokens": totals.stale_turn_tokens,
            "wasted_share": 1.0 - trained / sampled if sampled else 0.0,
            "per_trained": sampled / trained if trained else float("inf")}


# Its smoke test also checks the figures' relations (shares in [0, 1), the ratio of the two costs).
SMOKE_TESTED_IN = "tests/trainer/test_partial_benchmark.py"
QUICK = {"groups": 6, "samples": 2, "turns": 6, "slots": 4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8, help="turns per episode")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per turn")
    parser.add_argument("--slots", type=int, default=8, help="RUN slots of the worker")
    parser.add_argument("--span", type=float, default=1.2, help="episode duration / swap period (about)")
    args = parse_args(parser, QUICK)
    load_before = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="bench-partial-"))
    record = base / "record.jsonl"
    server = start_server(tiny=True, record=record)
    try:
        checkpoints = [save_perturbed_copy(tiny_model_dir(), base / f"ckpt-{i}", i, scale=0.01) for i in range(2)]
        results = {mode: run_mode(base, mode, server.url, record, checkpoints, args) for mode in ("restart", "continue")}
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    load_after = os.getloadavg()
    restart, partial = results["restart"], results["continue"]
    print(f"episodes of {args.turns} turns x {args.tokens} tokens, {args.groups} groups x {args.samples} samples, "
          f"{args.slots} RUN slots, lag bound {LAG}, a swap every {round(args.turns * args.slots / args.span)} "
          f"generations; load average {load_before[0]:.1f} -> {load_after[0]:.1f}")
    print_table("the same workload, restart vs continue", ["figure", "restart", "continue"], [
        ["tokens sampled", restart["sampled"], partial["sampled"]],
        ["tokens trained (loss mask 1)", restart["trained"], partial["trained"]],
        ["wasted token share", restart["wasted_share"], partial["wasted_share"]],
        ["tokens sampled per trained token", restart["per_trained"], partial["per_trained"]],
        ["groups trained", restart["groups"], partial["groups"]],
        ["stale groups resubmitted", restart["stale_groups"], partial["stale_groups"]],
        ["stale-turn tokens masked", restart["stale_turn_tokens"], partial["stale_turn_tokens"]],
        ["weight swaps", restart["swaps"], partial["swaps"]],
        ["swap period s (median)", restart["swap_every_s"], partial["swap_every_s"]],
        ["episode s (median, ok rows)", restart["episode_s"], partial["episode_s"]],
        ["wall s", restart["wall_s"], partial["wall_s"]],
    ])
    target = "met" if partial["wasted_share"] <= 0.05 else "MISSED"
    print(f"\nwasted_token_share_continue {partial['wasted_share']:.3f} (target <= 0.05: {target}); "
          f"restart wastes {restart['wasted_share']:.3f}")
    emit_json({
        "wasted_token_share_continue": round(partial["wasted_share"], 4),
        "wasted_token_share_restart": round(restart["wasted_share"], 4),
        "tokens_per_trained_token_ratio": round(restart["per_trained"] / partial["per_trained"], 3),
        "tokens_per_trained_token_continue": round(partial["per_trained"], 3),
        "tokens_per_trained_token_restart": round(restart["per_trained"], 3),
        "stale_groups_restart": restart["stale_groups"], "stale_groups_continue": partial["stale_groups"],
        "stale_turn_tokens_continue": partial["stale_turn_tokens"],
        "episode_s_restart": round(restart["episode_s"], 3), "episode_s_continue": round(partial["episode_s"], 3),
        "swap_every_s_restart": round(restart["swap_every_s"], 3),
        "swap_every_s_continue": round(partial["swap_every_s"], 3),
        "swaps_restart": restart["swaps"], "swaps_continue": partial["swaps"],
        "wall_s_restart": round(restart["wall_s"], 1), "wall_s_continue": round(partial["wall_s"], 1),
        "load_avg": [round(load_before[0], 2), round(load_after[0], 2)],
    })


if __name__ == "__main__":
    main()
