"""The inside of `python -m benchmarks.verl`, run in verl's venv (it needs verl's DataProto).

    python -m benchmarks.verl_pairs ARGS.json     # prints one JSON object last

Paired runs on one warm spool: SpoolLoopManager.generate_sequences on a verl batch of P prompts x
N samples, and the same prompt ids sent straight to the same backend (/v1/completions, the same
sampling, the workers' concurrency), alternating which goes first, after one uncounted pair
(first-call costs of either side). Then the assembly on its own:
synthetic trajectory shards (1,000-row shards of benchmarks.tail's rows) read by a fresh reader,
rows -> verl's layout (prompt_length 256, response_length 512) -> DataProto.

First calls (`first_call` in ARGS: "cold" alone, or "create" before the pairs), on workers that
have run nothing yet: the manager built as verl builds it (`create()`, which warms the workers)
or, for the figure without that warm-up, by its constructor; the seconds of its first
generate_sequences against the median of the WARM_CALLS that follow.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import cpu_seconds, cpu_wait_seconds, median

NOT_A_BENCHMARK = "the inside of benchmarks.verl (which runs it in verl's venv with its arguments file)"
WARM_CALLS = 3


def verl_batch(prompts: int, samples: int, run: int) -> Any:
    from verl import DataProto

    rows = []
    for index in range(prompts):
        rows.append({"data_source": "openai/gsm8k", "ability": "math",
                     "raw_prompt": [{"role": "user", "content": f"Run {run}, question {index}: what is {index} + 1?"}],
                     "reward_model": {"style": "rule", "ground_truth": str(index + 1)},
                     "extra_info": {"index": index}})
    batch = DataProto.from_single_dict({
        "dummy_tensor": __import__("torch").zeros((prompts, 1), dtype=__import__("torch").uint8),
        **{key: np.array([r[key] for r in rows], dtype=object) for key in rows[0]},
        "uid": np.array([str(uuid.uuid4()) for _ in rows], dtype=object),
    })
    batch.meta_info["global_steps"] = 1
    return batch.repeat(repeat_times=samples, interleave=True)


def config_of(args: dict[str, Any]) -> dict[str, Any]:
    return {
        "actor_rollout_ref": {"model": {"path": args["model"]}, "rollout": {
            "n": args["samples"], "prompt_length": 256, "response_length": args["max_tokens"],
            "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs_mode": "processed_logprobs",
            "calculate_log_probs": True, "name": "vllm"}},
        # ignore_eos: every sample is max_tokens long on both sides, the same work
        "hpc_rollout": {"spool": args["run"], "handler": "answer", "poll_s": 0.02, "sampling": {"ignore_eos": True}},
    }


async def direct(url: str, prompt_ids: list[list[int]], args: dict[str, Any]) -> float:
    """The same prompts straight to the backend, `concurrency` at a time; seconds. Through the
    workers' own HTTP transport, so the ratio is what the spool adds, not a difference of clients."""
    from orchestrator.llm.http import BackendHttp

    limit = asyncio.Semaphore(args["concurrency"])
    model = args["model"]
    async with BackendHttp(timeout_s=600) as http:
        async def one(ids: list[int]) -> None:
            async with limit:
                answer = await http.request("POST", f"{url}/completions", {
                    "model": model, "prompt": ids, "max_tokens": args["max_tokens"], "temperature": 1.0,
                    "top_p": 1.0, "n": 1, "logprobs": 0, "return_token_ids": True,
                    "return_tokens_as_token_ids": True, "skip_special_tokens": False, "ignore_eos": True})
                if answer.status != 200:
                    raise RuntimeError(f"direct request: HTTP {answer.status}: {answer.text[:200]}")
                answer.json()

        started = time.perf_counter()
        await asyncio.gather(*(one(ids) for ids in prompt_ids))
        return time.perf_counter() - started


def rendered(tokenizer: Any, batch: Any) -> list[list[int]]:
    from orchestrator.llm.conversation import Conversation

    return [list(Conversation(tokenizer, list(messages)).prompt_ids) for messages in batch.non_tensor_batch["raw_prompt"]]


def assembly_ms_per_1k(base: Path, rows: int, prompt_length: int, response_length: int) -> dict[str, float]:
    """Shards -> DataProto on `rows` synthetic trajectory rows (benchmarks.tail's: 120-token prompts,
    50-400-token responses) in 1,000-row shards: a fresh reader decodes them, rows -> verl's
    layout -> DataProto. Best of three (a shared machine); ms per 1,000 rows, and the split."""
    import random

    import torch
    from tensordict import TensorDict

    from benchmarks.tail import trajectory_row
    from orchestrator.config import Shards
    from orchestrator.spool.shards import ShardWriter
    from orchestrator.spool.rundir import init_run
    from orchestrator.trainer.tail import RowReader
    from orchestrator.trainer.verl.assemble import assemble
    from orchestrator.trainer.verl.manager import ROW_COLUMNS
    from verl import DataProto

    paths, _ = init_run(base / "assembly")
    rng = random.Random(0)
    writer = ShardWriter(paths, "w", Shards(max_rows=1000))
    template = [trajectory_row(rng, f"j{i}", f"g{i // 8}", i % 8) for i in range(1000)]
    for shard in range(max(1, rows // 1000)):
        for index, row in enumerate(template):
            writer.add({**row, "job_id": f"s{shard}-{index}", "group_id": f"s{shard}-g{index // 8}"}, "t")
        writer.commit()
    writer.close()
    best: dict[str, float] = {}
    for _ in range(3):
        began = time.perf_counter()
        with RowReader(paths, columns=ROW_COLUMNS) as reader:
            fetched = list(reader.rows())
        read = time.perf_counter()
        out = assemble(fetched, [r["group_id"] for r in fetched], [[0]] * len(fetched), prompt_length, response_length)
        laid = time.perf_counter()
        DataProto(batch=TensorDict({k: torch.from_numpy(v) for k, v in out.tensors.items()}, batch_size=len(fetched)),
                  non_tensor_batch=out.non_tensors, meta_info={})
        done = time.perf_counter()
        per_1k = 1000.0 / len(fetched) * 1000.0
        figures = {"total": (done - began) * per_1k, "read": (read - began) * per_1k,
                   "layout": (laid - read) * per_1k, "data_proto": (done - laid) * per_1k, "rows": len(fetched)}
        if not best or figures["total"] < best["total"]:
            best = figures
    return best


def inside_jobs(run: str) -> dict[str, float]:
    """Where the measured jobs' time went, from their rows: the LLM answer (turn latency) vs the rest
    of RUN (prompt rendering, routing, the session), EVAL, and the queues (not charged to jobs)."""
    import pyarrow.dataset as ds

    rows = ds.dataset(Path(run) / "shards", format="parquet").to_table(
        columns=["run_s", "eval_s", "queue_s", "turns", "handler"]).to_pylist()
    rows = [r for r in rows if r["turns"] and r["turns"][0]["output_ids"] and len(r["turns"][0]["output_ids"]) > 2]
    llm = [sum(t["latency_s"] or 0.0 for t in r["turns"]) for r in rows]
    return {"jobs": len(rows), "llm_s_mean": float(np.mean(llm)), "run_s_mean": float(np.mean([r["run_s"] for r in rows])),
            "run_outside_llm_s_mean": float(np.mean([r["run_s"] - l for r, l in zip(rows, llm)])),
            "eval_s_mean": float(np.mean([r["eval_s"] for r in rows])),
            "queue_s_mean": float(np.mean([r["queue_s"] for r in rows]))}


def spool_phases(run: str, began_at: float, ended_at: float, concurrency: int) -> dict[str, float]:
    """Where one generate_sequences call's wall time went, from its rows' stamps (one machine's
    clock, so comparable): fill = call start to the first RUN start (submit, claim, INIT); drain =
    the last RUN end to the call's return (EVAL, commit, the reader, assembly); run_busy = the RUN
    slots' use between (sum of RUN time / (concurrency x that span))."""
    import pyarrow.dataset as ds
    import pyarrow.compute as pc

    table = ds.dataset(Path(run) / "shards", format="parquet").to_table(
        columns=["submitted_at", "run_started_at", "run_ended_at", "run_s"])
    stamp = lambda column: pc.cast(table[column], "int64").to_numpy(zero_copy_only=False) / 1e6  # noqa: E731 (us)
    submitted = stamp("submitted_at")
    mine = (submitted >= began_at) & (submitted <= ended_at)
    starts, ends = stamp("run_started_at")[mine], stamp("run_ended_at")[mine]
    span = float(ends.max() - starts.min())
    busy = float(table["run_s"].to_numpy()[mine].sum()) / (concurrency * span)
    return {"fill_s": float(starts.min() - began_at), "drain_s": float(ended_at - ends.max()), "run_span_s": span,
            "run_busy": busy}


def server_steps(url: str) -> dict[str, float]:
    """serve-llm's step counters so far (its /metrics): steps, rows they carried, wall and CPU seconds."""
    import httpx

    page = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    return {line.split("{")[0].removeprefix("serve_llm:"): float(line.rsplit(" ", 1)[1])
            for line in page.splitlines() if line.startswith("serve_llm:")}


def first_calls(args: dict[str, Any], warm_up: bool) -> dict[str, Any]:
    """The first call on fresh workers against the warm calls after it (module doc)."""
    from orchestrator.trainer.verl.manager import SpoolLoopManager

    began = time.perf_counter()
    manager = SpoolLoopManager.create(config=config_of(args)) if warm_up else SpoolLoopManager(config_of(args))
    created = time.perf_counter() - began
    seconds = []
    for run in range(1 + WARM_CALLS):
        batch = verl_batch(args["prompts"], args["samples"], 1000 + run)
        began = time.perf_counter()
        counts = manager.generate(batch).meta_info["hpc_rollout"]
        seconds.append(time.perf_counter() - began)
        if counts["ok"] != len(batch):
            raise RuntimeError(f"first calls, call {run}: {counts}")
    manager.close()
    warm = median(seconds[1:])
    return {"create_s": created, "first_s": seconds[0], "warm_s": seconds[1:], "ratio": seconds[0] / warm}


def main(args: dict[str, Any]) -> dict[str, Any]:
    from orchestrator.llm.tokenizer import load_tokenizer
    from orchestrator.trainer.verl.manager import SpoolLoopManager

    if args.get("first_call") == "cold":
        return {"first_call": first_calls(args, warm_up=False)}
    first_call = first_calls(args, warm_up=True) if args.get("first_call") == "create" else None
    manager = SpoolLoopManager(config_of(args))
    tokenizer = load_tokenizer(args["model"])
    pairs = []
    # run -1 warms both sides up and is not counted: the manager process's first call pays once per
    # training run what no step pays again (verl's DataProto and tensordict on first use, the
    # reader's first scan of the shards), as the direct side's first call does its client's imports.
    for run in range(-1, args["pairs"]):
        batch = verl_batch(args["prompts"], args["samples"], run)
        ids = rendered(tokenizer, batch)
        order = ("spool", "direct") if run % 2 == 0 else ("direct", "spool")
        seconds: dict[str, float] = {}
        for side in order:
            cpu_before = (cpu_seconds([args["server_pid"]]), cpu_seconds(args["worker_pids"]), time.process_time())
            wait_before = cpu_wait_seconds([args["server_pid"]])
            steps_before = server_steps(args["url"])
            if side == "spool":
                began, began_at = time.perf_counter(), time.time()
                out = manager.generate(batch)
                seconds["spool"], ended_at = time.perf_counter() - began, time.time()
            else:
                seconds["direct"] = asyncio.run(direct(args["url"], ids, args))
            # the CPU of the call alone: what this benchmark reads afterwards is not the manager's
            seconds[f"{side}_wait_server"] = cpu_wait_seconds([args["server_pid"]]) - wait_before
            cpu_after = (cpu_seconds([args["server_pid"]]), cpu_seconds(args["worker_pids"]), time.process_time())
            for name, before, after in zip(("server", "workers", "self"), cpu_before, cpu_after):
                seconds[f"{side}_cpu_{name}"] = after - before
            steps = {k: v - steps_before[k] for k, v in server_steps(args["url"]).items()}
            seconds[f"{side}_steps"] = steps["steps_total"]
            seconds[f"{side}_rows_per_step"] = steps["step_rows_total"] / max(1.0, steps["steps_total"])
            seconds[f"{side}_step_ms"] = 1000 * steps["step_seconds_total"] / max(1.0, steps["steps_total"])
            seconds[f"{side}_step_cpu_ms"] = 1000 * steps["step_cpu_seconds_total"] / max(1.0, steps["steps_total"])
            if side == "spool":
                seconds.update(spool_phases(args["run"], began_at, ended_at, args["concurrency"]))
                counts = out.meta_info["hpc_rollout"]
                if counts["ok"] != len(batch):
                    raise RuntimeError(f"spool run {run}: {counts}")
                timing = out.meta_info["timing"]
                seconds["run_s_mean"] = timing["agent_loop/generate_sequences/mean"]
                seconds["queue_s_mean"] = timing["hpc_rollout/queue_s/mean"]
        if run >= 0:
            pairs.append({**seconds, "first": order[0], "ratio": seconds["spool"] / seconds["direct"]})
    manager.close()
    inside = inside_jobs(args["run"])
    assembly = assembly_ms_per_1k(Path(args["base"]), args["assemble_rows"], 256, 512)
    return {"pairs": pairs, "assembly": assembly, "inside_jobs": inside, "first_call": first_call}


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__ + "\nbenchmarks/verl.py writes ARGS.json and runs this in verl's venv: run that instead.")
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    print(json.dumps(main(json.loads(Path(sys.argv[1]).read_text()))))
