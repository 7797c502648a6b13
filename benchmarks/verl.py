"""verl's rollout through the spool vs the same prompts sent straight to the same backend.

    python -m benchmarks.verl [--prompts 64] [--samples 4] [--max-tokens 32] [--pairs 15]
                              [--workers 1] [--run-pool 20] [--max-batch 16]
    python -m benchmarks.verl --quick          # 8 prompts x 2 samples, one pair (the smoke size)
    python -m benchmarks.verl --skip-first-call  # the pairs and the assembly only

serve-llm --tiny (processed logprobs, verl's default) and a run with warm local workers (`answer`
handler) are started here; the measurement runs in verl's venv (scripts/verl-setup.sh), where
SpoolLoopManager lives (benchmarks/verl_pairs.py):
- spool: generate_sequences on a verl batch of prompts x samples (submit, workers, shards, reader,
  assembly into verl's DataProto), wall time;
- direct: the same prompt ids to the same server's /v1/completions, the same sampling (every
  sample exactly --max-tokens long: ignore_eos), at the workers' concurrency (workers x run pool);
- the server runs at most --max-batch requests together and both sides offer it more (20 > 16
  by default), as a deployment sizes its RUN slots above its backends' batch: between two jobs
  a slot is away from the server for 10-15 ms (the answer back, EVAL, the next job's prompt and
  request), which a few spare slots cover; verl's own loop sends every sample at once;
- the server runs on all CPUs but the last (orchestrator.devserver.cpus) and everything else (the
  workers, the manager, the direct client) on the last, as a cluster gives a model its GPU and
  the workers CPUs of their own: free to mix on 2 vCPUs, the server's threads waited for a CPU
  behind the workers (0.24-0.31 s a spool call against 0.10-0.13 direct; confined, 0.25-0.42
  against 0.24-0.39) and the ratio measured that contention, not orchestration (alternated over
  two hours: 9 runs shared, mean 1.128; 11 confined, mean 1.045; docs/trainer.md). --share-cpus
  measures the shared arrangement;
- pairs alternate which side goes first; overhead_ratio = median of spool / direct over the
  pairs (neighbours, so drift of a shared machine cancels), with a 90% bootstrap interval of that
  median: a call's time drifts by 10-20% between neighbouring calls on this shared host, so the
  median of 7 pairs moved by +-0.05 between runs of the same code; 15 pairs by default. Target
  <= 1.10 at 64 x 4. One pair
  before them is not counted: the first call of each side pays once what no later step pays
  (imports, verl's DataProto on first use, the reader's first scan).
- assemble_ms_per_1k_samples: shards to DataProto on synthetic trajectory rows (benchmarks.tail's:
  120-token prompts, 50-400-token responses; 4,000 rows, 1,000 with --quick): a fresh reader
  decodes the shards, rows -> verl's layout (256 + 512 wide) -> DataProto, best of three, per
  1,000 samples. Target <= 200.
- first_call_ratio: a step's first generate_sequences on fresh workers (started, alive, no job run
  yet) over the median of the 3 calls after it, same batch size. The manager built as verl builds
  it (`create()`, which warms the workers: orchestrator/trainer/verl/warm_up.py), and, for the
  figure before that warm-up existed, by its constructor on workers of a run of its own. Target
  <= 1.5: a `time_limit_s` sized on warm steps must not cut the first one.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, median, median_interval, print_table, submit_all
from orchestrator.app.local_launch import start_local_workers
from orchestrator.devserver.cpus import client_cpus, confine_to, server_cpus
from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run
from orchestrator.worker.options import WorkerOptions
from benchmarks.backends import wait_drained, wait_for_workers
from tests.verl.env import VerlEnv, verl_env

TARGET_RATIO = 1.10
TARGET_ASSEMBLE_MS = 200.0
TARGET_FIRST_CALL_RATIO = 1.5


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=15, help="counted pairs (one more warms up, uncounted)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--run-pool", type=int, default=20, help="RUN slots per worker (both sides' concurrency: workers x this)")
    parser.add_argument("--max-batch", type=int, default=16, help="the server's largest running batch")
    parser.add_argument("--share-cpus", action="store_true",
                        help="let the server and its clients share every CPU (default: the server gets all but the last)")
    parser.add_argument("--quick", action="store_true", help="8 prompts x 2 samples, one pair: a smoke run")
    parser.add_argument("--skip-first-call", action="store_true",
                        help="leave out the first-call figures (two rounds of fresh workers)")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.samples, args.pairs, args.max_tokens = 8, 2, 1, 8
    # chosen once, before this process confines itself to the clients' CPUs
    args.server_cpus, args.client_cpus = (None, None) if args.share_cpus else (server_cpus(), client_cpus())
    return args


def main() -> None:
    args = parse()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-verl-") as tmp:
        base = Path(tmp)
        verl = verl_env(base / "verl-env")
        # One model thread on CPUs of its own; the other is for the workers (and the direct client),
        # else the spool side measures CPU contention with the model, not orchestration.
        server = start_server(threads=1, extra_args=("--logprobs-mode", "processed", "--max-batch", str(args.max_batch)),
                              cpus=args.server_cpus)
        if args.client_cpus:
            confine_to(args.client_cpus)   # the workers and the verl venv started below inherit it
        try:
            options = WorkerOptions(run_pool=args.run_pool, init_pool=args.run_pool, eval_pool=args.run_pool,
                                    runtime="local")
            cold = None if args.skip_first_call else first_call_without_warm_up(args, verl, base, server, options)
            paths = new_run(base / "run", server.url)
            launch = start_local_workers(paths, args.workers, options, verbose=0)
            try:
                wait_for_workers(paths, args.workers)
                if args.skip_first_call:   # else create()'s warm-up and the first calls warm them
                    warmup = [{"prompt": [{"role": "user", "content": f"warm-up {i}"}],
                               "reward_model": {"ground_truth": "0"}, "sampling": {"max_tokens": 2}}
                              for i in range(args.workers * args.run_pool)]
                    submit_all(paths, enumerate(warmup, 1), handler="answer")
                    wait_drained(paths, len(warmup))
                inner = {**inner_args(args, base, paths, server), "worker_pids": launch.pids,
                         "first_call": None if args.skip_first_call else "create"}
                began = time.monotonic()
                figures = run_inner(verl, base, inner)
                inner_s = time.monotonic() - began
            finally:
                launch.terminate(timeout_s=60)
        finally:
            server.stop()
    if cold is not None:
        figures["first_call_cold"] = cold
    report(args, figures, load_before, os.getloadavg(), inner_s)


def new_run(root: Path, url: str) -> SpoolPaths:
    paths, _ = init_run(root, {"shards.idle_flush_s": 0.05, "shards.max_age_s": 0.5})
    BackendRegistry.of(paths).add(url, logprob_mode="processed", tokenizer=str(tiny_model_dir()))
    return paths


def inner_args(args: argparse.Namespace, base: Path, paths: SpoolPaths, server: LocalServer) -> dict[str, Any]:
    return {"run": str(paths.root), "url": server.url, "model": str(tiny_model_dir()),
            "prompts": args.prompts, "samples": args.samples, "max_tokens": args.max_tokens,
            "pairs": args.pairs, "concurrency": args.workers * args.run_pool,
            "base": str(base), "assemble_rows": 1000 if args.quick else 4000, "server_pid": server.pid}


def run_inner(verl: VerlEnv, base: Path, inner: dict[str, Any]) -> dict[str, Any]:
    arguments = base / "args.json"
    arguments.write_text(json.dumps(inner))
    done = verl.run("-m", "benchmarks.verl_pairs", str(arguments), timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"benchmarks.verl_pairs failed:\n{done.stderr[-4000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def first_call_without_warm_up(args: argparse.Namespace, verl: VerlEnv, base: Path, server: LocalServer,
                               options: WorkerOptions) -> dict[str, Any]:
    """The first calls of a manager that does not warm the workers (its constructor, as before
    create() did), on fresh workers of a run of their own."""
    paths = new_run(base / "run-cold", server.url)
    launch = start_local_workers(paths, args.workers, options, verbose=0)
    try:
        wait_for_workers(paths, args.workers)
        inner = {**inner_args(args, base, paths, server), "worker_pids": launch.pids, "first_call": "cold"}
        cold: dict[str, Any] = run_inner(verl, base, inner)["first_call"]
        return cold
    finally:
        launch.terminate(timeout_s=60)


def cpus_line(args: argparse.Namespace) -> str:
    if args.share_cpus:
        return "shared (--share-cpus): the server, the workers and the manager may each use any"
    return (f"the server on {sorted(args.server_cpus)}, "
            f"the workers and the manager (or the direct client) on {sorted(args.client_cpus)}")


def mean_of(pairs: list[dict[str, Any]], key: str) -> float:
    return sum(p[key] for p in pairs) / len(pairs)


def report(args: argparse.Namespace, figures: dict[str, Any], load_before: tuple[float, ...],
           load_after: tuple[float, ...], inner_s: float) -> None:
    pairs = figures["pairs"]
    print_table(f"generate_sequences, {args.prompts} prompts x {args.samples} samples, {args.max_tokens} tokens each",
                ["pair", "first", "spool s", "direct s", "spool / direct", "fill s", "RUN span s", "RUN slots busy",
                 "drain s", "job RUN s (mean)"],
                [[i + 1, p["first"], p["spool"], p["direct"], p["ratio"], p["fill_s"], p["run_span_s"], p["run_busy"],
                  p["drain_s"], p["run_s_mean"]] for i, p in enumerate(pairs)])
    print("  fill: the call's start to the first RUN start (submit, claims, INIT); drain: the last RUN end to\n"
          "  the call's return (EVAL, commit, the reader, assembly); RUN slots busy: their use between.")
    print_table("CPU seconds per call (means over the pairs): what shares the 2 cores with the model",
                ["side", "server (model + HTTP)", "server waited for a CPU", "workers", "this process (manager or client)"],
                [[side, mean_of(pairs, f"{side}_cpu_server"), mean_of(pairs, f"{side}_wait_server"),
                  mean_of(pairs, f"{side}_cpu_workers") if side == "spool" else "-",
                  mean_of(pairs, f"{side}_cpu_self")] for side in ("spool", "direct")])
    print_table("the server's steps per call (means over the pairs; serve-llm's /metrics)",
                ["side", "steps", "rows per step", "ms per step (wall)", "ms per step (model thread CPU)"],
                [[side, mean_of(pairs, f"{side}_steps"), mean_of(pairs, f"{side}_rows_per_step"),
                  mean_of(pairs, f"{side}_step_ms"), mean_of(pairs, f"{side}_step_cpu_ms")] for side in ("spool", "direct")])
    print("  more steps or fewer rows per step: the batch had holes; more ms per step: the model ran slower")
    ratio = median([p["ratio"] for p in pairs])
    inside = figures["inside_jobs"]
    print_table(f"inside the {inside['jobs']} spool jobs (means, seconds)", ["LLM answer", "RUN", "RUN outside the LLM",
                                                                            "EVAL", "queued"],
                [[inside["llm_s_mean"], inside["run_s_mean"], inside["run_outside_llm_s_mean"], inside["eval_s_mean"],
                  inside["queue_s_mean"]]])
    assembly = figures["assembly"]
    assemble_ms = assembly["total"]
    print_table(f"shards -> DataProto, {assembly['rows']} rows (120-token prompts, 50-400-token responses), ms per 1,000",
                ["step", "ms"], [["decode + rows (fresh reader)", assembly["read"]],
                                 ["verl's layout (assemble)", assembly["layout"]], ["DataProto", assembly["data_proto"]]])
    low, high = median_interval([p["ratio"] for p in pairs])
    first, cold = figures.get("first_call"), figures.get("first_call_cold")
    if first is not None and cold is not None:
        print_table(f"first call on fresh workers vs the {len(first['warm_s'])} after it (same batch)",
                    ["manager built by", "create s", "first call s", "warm calls s (median)", "first / warm"],
                    [[name, f["create_s"], f["first_s"], median(f["warm_s"]), f["ratio"]]
                     for name, f in (("its constructor: no warm-up", cold), ("create(): warms the workers", first))])
    print_table("figures vs targets", ["figure", "measured", "target"], [
        ["overhead_ratio (median)", ratio, f"<= {TARGET_RATIO}"],
        [f"  its 90% interval ({len(pairs)} pairs)", f"{low:.3f}-{high:.3f}", ""],
        ["assemble_ms_per_1k_samples", assemble_ms, f"<= {TARGET_ASSEMBLE_MS:.0f}"],
        *([["first_call_ratio (create() warms)", first["ratio"], f"<= {TARGET_FIRST_CALL_RATIO}"],
           ["  without the warm-up", cold["ratio"], ""]] if first is not None and cold is not None else []),
    ])
    print(f"\nCPUs: {cpus_line(args)}")
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} ({os.cpu_count()} CPUs); "
          f"{args.workers * args.run_pool} requests offered to a batch of {args.max_batch}; "
          f"verl-venv process {inner_s:.0f} s (its imports included)")
    emit_json({
        "benchmark": "verl", "quick": args.quick, "prompts": args.prompts, "samples": args.samples,
        "max_tokens": args.max_tokens, "pairs": len(pairs), "concurrency": args.workers * args.run_pool,
        "max_batch": args.max_batch, "cpus": cpus_line(args),
        "overhead_ratio": round(ratio, 4), "overhead_ratio_target": TARGET_RATIO,
        "overhead_ratio_ok": ratio <= TARGET_RATIO,
        "overhead_ratio_interval_90": [round(low, 4), round(high, 4)],
        "spool_s": [round(p["spool"], 3) for p in pairs], "direct_s": [round(p["direct"], 3) for p in pairs],
        "cpu_s_per_call": {key: round(mean_of(pairs, key), 3) for key in
                           ("spool_cpu_server", "spool_wait_server", "spool_cpu_workers", "spool_cpu_self",
                            "direct_cpu_server", "direct_wait_server", "direct_cpu_self")},
        "spool_phases": {k: [round(p[k], 3) for p in pairs] for k in ("fill_s", "run_span_s", "run_busy", "drain_s")},
        "server_steps": {f"{side}_{k}": round(mean_of(pairs, f"{side}_{k}"), 3) for side in ("spool", "direct")
                         for k in ("steps", "rows_per_step", "step_ms", "step_cpu_ms")},
        "assemble_ms_per_1k_samples": round(assemble_ms, 2), "assemble_target_ms": TARGET_ASSEMBLE_MS,
        "assemble_ok": assemble_ms <= TARGET_ASSEMBLE_MS, "assembled_rows": assembly["rows"],
        "assemble_split_ms": {k: round(v, 2) for k, v in assembly.items() if k not in ("rows", "total")},
        "inside_jobs_s": {k: round(v, 4) for k, v in inside.items()},
        "load_before": round(load_before[0], 2), "load_after": round(load_after[0], 2),
        **(first_call_json(first, cold) if first is not None and cold is not None else {}),
    })


def first_call_json(first: dict[str, Any], cold: dict[str, Any]) -> dict[str, Any]:
    def rounded(f: dict[str, Any]) -> dict[str, Any]:
        return {"create_s": round(f["create_s"], 3), "first_s": round(f["first_s"], 3),
                "warm_s": [round(s, 3) for s in f["warm_s"]], "ratio": round(f["ratio"], 3)}
    return {"first_call_ratio": round(first["ratio"], 3), "first_call_ratio_target": TARGET_FIRST_CALL_RATIO,
            "first_call_ratio_ok": first["ratio"] <= TARGET_FIRST_CALL_RATIO,
            "first_call_ratio_without_warm_up": round(cold["ratio"], 3),
            "first_call": {"create": rounded(first), "constructor": rounded(cold)}}


if __name__ == "__main__":
    main()
