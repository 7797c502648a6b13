"""A large run directory made up fast, for the report benchmark: shards, events, heartbeats, registry.

Every column is built as an Arrow array from numpy draws (no Python object per row); events are
formatted lines. Durations are lognormal; jobs of a worker follow each other on its slots.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rows import SCHEMA, TOOL_CALL_TYPE, TURN_TYPE
from orchestrator.spool.shardlog import shard_name
from orchestrator.spool.rundir import init_run

WORKERS = 16
RUN_SLOTS = 8
ROWS_PER_SHARD = 1000
TURNS = 3
BACKENDS = ("http://node01:8000/v1", "http://node02:8000/v1", "http://node03:8000/v1", "http://node04:8000/v1")


def _lists(values: np.ndarray, lengths: np.ndarray, kind: pa.DataType) -> pa.Array:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, kind))


def synthesize(root: Path, jobs: int, seed: int = 0) -> SpoolPaths:
    paths, _ = init_run(root)
    rng = np.random.default_rng(seed)
    t0 = time.time() - 3600.0
    submission = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t0)) + f"{int(t0 * 1000) % 1000:03d}-beef"
    (paths.submissions / f"{submission}.json").write_bytes(orjson.dumps({"submission_id": submission, "jobs": jobs}))
    index = np.arange(jobs)
    job_ids = np.char.add(f"{submission}-", np.char.add(np.char.zfill((index // 8).astype(str), 7),
                                                         np.char.add("-", np.char.zfill((index % 8).astype(str), 4))))
    worker = index % WORKERS
    init_s = rng.lognormal(np.log(0.5), 0.5, jobs)
    run_s = rng.lognormal(np.log(4.0), 0.8, jobs)
    eval_s = rng.lognormal(np.log(0.2), 0.5, jobs)
    # Jobs of one worker slot run back to back: a cumulative sum per lane.
    lane = worker * RUN_SLOTS + (index // WORKERS) % RUN_SLOTS
    order = np.lexsort((index, lane))
    span = (init_s + run_s + eval_s)[order]
    ends = np.cumsum(span)
    lane_sorted = lane[order]
    first = np.concatenate([[True], lane_sorted[1:] != lane_sorted[:-1]])
    lane_base = np.maximum.accumulate(np.where(first, ends - span, 0.0))
    starts = np.empty(jobs)
    starts[order] = t0 + 5.0 + (ends - span - lane_base)
    init_start = starts
    run_start = init_start + init_s
    eval_start = run_start + run_s
    finished = eval_start + eval_s
    status = np.where(rng.random(jobs) < 0.05, "failed", "ok").astype(object)
    status[rng.random(jobs) < 0.01] = "cancelled"
    ok = status == "ok"
    reward = np.where(ok, (rng.random(jobs) < 0.6).astype(float), np.nan)
    backend = rng.integers(0, len(BACKENDS), jobs)
    version = np.where(starts > t0 + 1800, 2, 1)
    _write_shards(paths, rng, job_ids, worker, status, reward, backend, version, init_s, run_s, eval_s,
                  t0, run_start, eval_start, finished)
    _write_events(paths, job_ids, worker, status, backend, init_start, run_start, eval_start, finished,
                  init_s, run_s, eval_s)
    _write_small_files(paths, t0, finished.max())
    return paths


def _write_shards(paths: SpoolPaths, rng: np.random.Generator, job_ids: np.ndarray, worker: np.ndarray,
                  status: np.ndarray, reward: np.ndarray, backend: np.ndarray, version: np.ndarray,
                  init_s: np.ndarray, run_s: np.ndarray, eval_s: np.ndarray, t0: float,
                  run_start: np.ndarray, eval_start: np.ndarray, finished: np.ndarray) -> None:
    jobs = len(job_ids)
    out_tokens = rng.integers(8, 48, (jobs, TURNS))
    writes = []
    for first in range(0, jobs, ROWS_PER_SHARD):
        rows = slice(first, min(first + ROWS_PER_SHARD, jobs))
        n = rows.stop - rows.start
        outs = out_tokens[rows].reshape(-1)
        turn_count = n * TURNS
        input_len = np.full(turn_count, 8)
        sent = (run_start[rows, None] + np.arange(TURNS) * (run_s[rows, None] / TURNS)).reshape(-1)
        urls = np.repeat(np.array(BACKENDS, dtype=object)[backend[rows]], TURNS)
        turns_struct = pa.StructArray.from_arrays([
            _lists(rng.integers(0, 30000, input_len.sum()), input_len, pa.int32()),
            _lists(rng.integers(0, 30000, outs.sum()), outs, pa.int32()),
            _lists(-rng.random(outs.sum()).astype(np.float32), outs, pa.float32()),
            pa.array(urls, pa.string()), pa.array(np.repeat(version[rows], TURNS), pa.int64()),
            pa.array(np.full(turn_count, "stop", dtype=object), pa.string()), pa.nulls(turn_count, pa.string()),
            pa.array(np.full(turn_count, "raw", dtype=object), pa.string()), pa.array(sent),
            pa.array(rng.lognormal(np.log(0.8), 0.6, turn_count)), pa.array(np.full(turn_count, "/models/policy", dtype=object)),
            pa.array(np.full(turn_count, "sha256:0123456789abcdef", dtype=object)),
        ], fields=list(TURN_TYPE))
        turns = pa.ListArray.from_arrays(pa.array(np.arange(0, turn_count + 1, TURNS, dtype=np.int32)), turns_struct)
        response_len = out_tokens[rows].sum(axis=1)
        failed = status[rows] != "ok"
        tool_rows = rng.random(n) < 0.3
        # 30% of the rows made two tool calls (bash, then python), as the agent handlers record them
        calls = [[{"turn": 1, "name": "bash", "arguments": "{}", "exit_code": 0, "output_chars": 3,
                   "latency_ms": float(rng.lognormal(4, 1)), "error": None, "output": "ok\n"},
                  {"turn": 2, "name": "python", "arguments": "{}", "exit_code": 1, "output_chars": 9,
                   "latency_ms": float(rng.lognormal(5, 1)), "error": None, "output": "Traceback"}]
                 if has else None for has in tool_rows]
        stamp = lambda values: pa.array((values * 1e6).astype(np.int64), pa.timestamp("us", tz="UTC"))  # noqa: E731
        columns = {
            "job_id": pa.array(job_ids[rows]), "group_id": pa.array(np.char.rpartition(job_ids[rows], "-")[:, 0]),
            "instance_id": pa.array(job_ids[rows]), "sample_index": pa.array(np.arange(rows.start, rows.stop) % 8, pa.int32()),
            "group_size": pa.array(np.full(n, 8), pa.int32()),
            "handler": pa.array(np.full(n, "agent", dtype=object), pa.string()),
            "data_source": pa.array(np.where(np.arange(rows.start, rows.stop) % 3 == 0, "math", "code").astype(object), pa.string()),
            "status": pa.array(status[rows].astype(object), pa.string()),
            "reward": pa.array(reward[rows], pa.float64(), from_pandas=True),
            "prompt_ids": _lists(rng.integers(0, 30000, n * 16), np.full(n, 16), pa.int32()),
            "response_ids": _lists(rng.integers(0, 30000, response_len.sum()), response_len, pa.int32()),
            "response_mask": _lists(np.ones(response_len.sum(), np.int8), response_len, pa.int8()),
            "logprobs": _lists(-rng.random(response_len.sum()).astype(np.float32), response_len, pa.float32()),
            "sampled_tokens": pa.array(response_len, pa.int32()), "turns": turns,
            "policy_version_min": pa.array(version[rows], pa.int64()), "policy_version_max": pa.array(version[rows], pa.int64()),
            "model": pa.array(np.full(n, "/models/policy", dtype=object), pa.string()),
            "tokenizer_hash": pa.array(np.full(n, "sha256:0123456789abcdef", dtype=object), pa.string()),
            "logprob_mode": pa.array(np.full(n, "raw", dtype=object), pa.string()),
            "init_s": pa.array(init_s[rows]), "run_s": pa.array(run_s[rows]), "eval_s": pa.array(eval_s[rows]),
            "queue_s": pa.array(run_start[rows] - init_s[rows] - t0), "counted_s": pa.array(init_s[rows] + run_s[rows] + eval_s[rows]),
            "submitted_at": stamp(np.full(n, t0)), "run_started_at": stamp(run_start[rows]),
            "run_ended_at": stamp(eval_start[rows]), "finished_at": stamp(finished[rows]),
            "worker": pa.array(np.char.add("w", worker[rows].astype(str)).astype(object), pa.string()),
            "node": pa.array(np.char.add("node", (worker[rows] // 4).astype(str)).astype(object), pa.string()),
            "attempt": pa.array(np.ones(n, np.int32)),
            "error_stage": pa.array(np.where(failed, "run", None), pa.string()),
            "error": pa.array(np.where(failed, "ToolCrash: the tool died", None), pa.string()),
            "instance": pa.array(np.full(n, "{}", dtype=object), pa.string()),
            "sampling": pa.array(np.full(n, "{}", dtype=object), pa.string()),
            "result": pa.array(np.full(n, "{}", dtype=object), pa.string()),
            "stop_reason": pa.array(np.where(tool_rows, "finished", None), pa.string()),
            "tool_calls": pa.array(calls, pa.list_(TOOL_CALL_TYPE)),
            "malformed_calls": pa.array(np.where(tool_rows, 0, None), pa.int32()),
        }
        # columns the report does not read (per-turn rewards, spans...) stay null, as in rows of handlers that have none
        table = pa.table([columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in SCHEMA], schema=SCHEMA)
        name = shard_name("synthetic", first // ROWS_PER_SHARD)
        writes.append((table, paths.shards / name))
    with ThreadPoolExecutor(2) as pool:  # Parquet encoding releases the GIL
        list(pool.map(lambda job: pq.write_table(job[0], job[1], compression="zstd", compression_level=1), writes))


def _write_events(paths: SpoolPaths, job_ids: np.ndarray, worker: np.ndarray, status: np.ndarray,
                  backend: np.ndarray, init_start: np.ndarray, run_start: np.ndarray, eval_start: np.ndarray,
                  finished: np.ndarray, init_s: np.ndarray, run_s: np.ndarray, eval_s: np.ndarray) -> None:
    for w in range(WORKERS):
        mine = np.flatnonzero(worker == w)
        lines = []
        name = f"w{w}"
        for i in mine:
            job = job_ids[i]
            lines.append(
                f'{{"t":{init_start[i]:.6f},"job":"{job}","event":"init_started","worker":"{name}","attempt":1}}\n'
                f'{{"t":{run_start[i]:.6f},"job":"{job}","event":"init_finished","worker":"{name}","s":{init_s[i]:.6f}}}\n'
                f'{{"t":{run_start[i]:.6f},"job":"{job}","event":"run_started","worker":"{name}","attempt":1}}\n'
                f'{{"t":{run_start[i]:.6f},"job":"{job}","event":"llm_backend","worker":"{name}","backend":"{BACKENDS[backend[i]]}"}}\n'
                f'{{"t":{eval_start[i]:.6f},"job":"{job}","event":"run_finished","worker":"{name}","s":{run_s[i]:.6f}}}\n'
                f'{{"t":{eval_start[i]:.6f},"job":"{job}","event":"eval_started","worker":"{name}","attempt":1}}\n'
                f'{{"t":{finished[i]:.6f},"job":"{job}","event":"eval_finished","worker":"{name}","s":{eval_s[i]:.6f}}}\n'
                f'{{"t":{finished[i]:.6f},"job":"{job}","event":"finished","worker":"{name}","status":"{status[i]}"}}\n'
            )
        (paths.events / f"{name}.jsonl").write_text("".join(lines))


def _write_small_files(paths: SpoolPaths, t0: float, last: float) -> None:
    for w in range(WORKERS):
        info = {"worker_id": f"w{w}", "node": f"node{w // 4}", "host": "synthetic", "state": "stopped",
                "started_at": t0, "heartbeat_at": float(last),
                "pools": {"init": {"busy": 0, "size": 4}, "run": {"busy": 0, "size": RUN_SLOTS}, "eval": {"busy": 0, "size": 4}},
                "counters": {}}
        (paths.workers / "gone").mkdir(exist_ok=True)
        (paths.workers / "gone" / f"w{w}.json").write_bytes(orjson.dumps(info))
    registry = {"format": 1, "policy_version": 2, "updated_at": t0,
                "backends": [{"url": url, "protocol": "vllm", "model": "/models/policy", "policy_version": 2,
                              "node": f"node0{i + 1}", "state": "up"} for i, url in enumerate(BACKENDS)]}
    paths.backends.write_bytes(orjson.dumps(registry))
    history = [{"t": t0 + 1800, "url": url, "change": "version", "state": "up", "policy_version": 2, "from_version": 1}
               for url in BACKENDS]
    history += [{"t": t0 + 1000, "url": BACKENDS[1], "change": "state", "state": "down", "reason": "synthetic"},
                {"t": t0 + 1100, "url": BACKENDS[1], "change": "state", "state": "up"}]
    paths.backends_history.parent.mkdir(parents=True, exist_ok=True)
    paths.backends_history.write_bytes(b"".join(orjson.dumps(h) + b"\n" for h in history))
