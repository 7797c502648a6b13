"""The trainer's tail: commit-to-reader latency, read throughput, and the cost of a poll.

    python -m benchmarks.tail [--writers 4] [--seconds 20] [--rows 50000] [--big 100000]

Figures:
  tail_p99_s                 4 writer processes commit trajectory shards every ~50 ms; a
                             follow-mode reader (poll 0.2 s) notes when it holds each shard's
                             rows; p99 of (held - committed), same clock (target <= 1 s)
  reader_rows_per_s          rows/s of RowReader over 50 shards of 1,000 trajectory rows (120
                             prompt + 50-400 response tokens each), with the trainer's columns
                             (target >= 50,000); all columns shown beside; also per CPU second,
                             which a machine shared with other jobs does not blur
  reader_batch_rows_per_s    the same rows through reader.batches() (Arrow record batches, one
                             per shard, no dict per row), side by side with rows()
  list_cost_ratio_1e5_vs_1e2 time of one poll with 100 open writers and 100,000 shards in the
                             directory vs 100 shards (target <= 2); the old design (list and
                             sort every shard name) measured beside it
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, median, parse_args, percentile, print_table
from orchestrator.spool import fsops
from orchestrator.config import Shards
from orchestrator.trainer.cursor import Cursor
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shardlog import WriterDirectory, shard_name
from orchestrator.spool.shards import ShardWriter
from orchestrator.spool.rundir import init_run
from orchestrator.trainer.tail import TRAINER_COLUMNS, RowReader


def trajectory_row(rng: random.Random, job: str, group: str, index: int) -> dict[str, Any]:
    response = [rng.randrange(4096) for _ in range(rng.randint(50, 400))]
    return {
        "job_id": job, "group_id": group, "group_size": 8, "sample_index": index, "status": "ok",
        "handler": "chat", "data_source": "chat", "reward": rng.random(),
        "prompt_ids": [rng.randrange(4096) for _ in range(120)], "response_ids": response,
        "response_mask": [1] * len(response), "logprobs": [-rng.random() for _ in response],
        "policy_version_min": 3, "policy_version_max": 3, "worker": "w",
        "turns": [{"input_ids": [1, 2, 3], "output_ids": response, "logprobs": [-0.5] * len(response),
                   "backend": "http://n:8000/v1", "policy_version": 3, "finish_reason": "stop"}],
        "instance": '{"messages": []}', "sampling": "{}",
    }


# -- tail latency ---------------------------------------------------------------------------
WRITER = """
import random, sys, time
from benchmarks.tail import trajectory_row
from orchestrator.config import Shards
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shards import ShardWriter
root, name, seconds, log = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
rng = random.Random(name)
writer = ShardWriter(SpoolPaths.of(root), name, Shards())
end = time.monotonic() + seconds
with open(log, "w") as out:
    n = 0
    while time.monotonic() < end:
        for _ in range(rng.randint(1, 16)):
            n += 1
            writer.add(trajectory_row(rng, f"{name}-{n}", f"{name}-g{n}", 0), str(n))
        writer.commit()
        out.write(f"{writer.writer} {writer.last_seq} {time.time()}\\n")
        out.flush()
        time.sleep(rng.uniform(0.0, 0.1))
writer.close()
"""


def tail_latency(base: Path, writers: int, seconds: float) -> dict[str, float]:
    paths, _ = init_run(base / "latency")
    logs = [base / f"writer{i}.log" for i in range(writers)]
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(paths.root), f"w{i}", str(seconds), str(logs[i])])
             for i in range(writers)]
    reader = RowReader(paths, poll_s=0.2, columns=TRAINER_COLUMNS)
    held_at: dict[tuple[str, int], float] = {}
    rows = 0
    while True:
        alive = any(p.poll() is None for p in procs)
        before = reader.cursor.next_seq
        fetched = reader.poll()
        now = time.time()
        for writer, seq in reader.cursor.next_seq.items():
            for s in range(before.get(writer, 1), seq):
                held_at[(writer, s)] = now
        rows += sum(1 for _ in reader.rows())
        if fetched == 0:
            if not alive:
                break
            time.sleep(reader.poll_s)
    for proc in procs:
        proc.wait()
    lags = []
    for log in logs:
        for line in log.read_text().splitlines():
            writer, seq, committed = line.split()
            if (writer, int(seq)) in held_at:
                lags.append(held_at[(writer, int(seq))] - float(committed))
    return {"shards": len(lags), "rows": rows, "p50_s": median(lags), "p99_s": percentile(lags, 0.99),
            "max_s": max(lags)}


# -- read throughput ------------------------------------------------------------------------
def read_throughput(base: Path, total_rows: int) -> dict[str, float]:
    paths, _ = init_run(base / "throughput")
    rng = random.Random(0)
    writer = ShardWriter(paths, "w", Shards(max_rows=1000))
    template = [trajectory_row(rng, f"j{i}", f"g{i // 8}", i % 8) for i in range(1000)]
    for shard in range(total_rows // 1000):
        for index, row in enumerate(template):
            writer.add({**row, "job_id": f"s{shard}-{index}", "group_id": f"s{shard}-g{index // 8}"}, "t")
        writer.commit()
    figures: dict[str, float] = {}
    for _ in range(3):   # best of three: the machine is shared
        for label, columns, mode in (("trainer_columns", TRAINER_COLUMNS, "rows"), ("all_columns", None, "rows"),
                                     ("groups_trainer_columns", TRAINER_COLUMNS, "groups"),
                                     ("batches_trainer_columns", TRAINER_COLUMNS, "batches"),
                                     ("batches_all_columns", None, "batches")):
            started, cpu = time.perf_counter(), time.process_time()
            reader = RowReader(paths, columns=columns)
            if mode == "rows":
                count = sum(1 for _ in reader.rows())
            elif mode == "groups":
                count = sum(len(g) for g in reader.groups())
            else:
                count = 0
                for batch in reader.batches():
                    str(reader.cursor)   # a trainer persists the cursor after each batch: its cost is counted
                    count += batch.num_rows
            figures[label] = max(figures.get(label, 0.0), count / (time.perf_counter() - started))
            figures[f"{label}_cpu"] = max(figures.get(f"{label}_cpu", 0.0), count / (time.process_time() - cpu))
    return figures


# -- cost of a poll -------------------------------------------------------------------------
def poll_cost(base: Path, shards: int, writers: int, polls: int) -> dict[str, float]:
    """One poll with every writer open and the reader at the end (nothing new to fetch)."""
    paths = SpoolPaths.of(base / f"poll-{shards}")
    init_run(paths.root)
    directory = WriterDirectory(paths)
    per_writer = shards // writers
    for w in range(writers):
        name = directory.register(f"node{w:03d}-1-abcd")
        for seq in range(1, per_writer + 1):
            (paths.shards / shard_name(name, seq)).touch()   # content is never read: the cursor is past them
    cursor = Cursor.of({w: per_writer + 1 for w in directory.open()}, [])
    reader = RowReader(paths, cursor)
    reader.poll()
    ops_before = sum(fsops.OPS.values())
    times = []
    for _ in range(polls):
        started = time.perf_counter()
        reader.poll()
        times.append(time.perf_counter() - started)
    ops = (sum(fsops.OPS.values()) - ops_before) / polls
    old = []
    for _ in range(max(3, polls // 20)):   # the previous design: list and sort every shard name
        started = time.perf_counter()
        sorted(n for n in os.listdir(paths.shards) if n.endswith(".parquet"))
        old.append(time.perf_counter() - started)
    return {"shards": shards, "writers": writers, "poll_s": median(times), "ops_per_poll": ops,
            "old_list_s": median(old)}


# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"writers": 2, "seconds": 1.0, "rows": 2000, "big": 2000, "polls": 20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--polls", type=int, default=200)
    args = parse_args(parser, QUICK)
    base = Path(tempfile.mkdtemp(prefix="bench-tail-"))
    try:
        latency = tail_latency(base, args.writers, args.seconds)
        print_table("commit -> reader holds the rows (follow mode, poll 0.2 s)",
                    ["writers", "shards", "rows", "p50 s", "p99 s", "max s"],
                    [[args.writers, latency["shards"], latency["rows"], latency["p50_s"], latency["p99_s"], latency["max_s"]]])
        speed = read_throughput(base, args.rows)
        print_table(f"RowReader over {args.rows} trajectory rows (1,000 per shard; best of 3)",
                    ["read", "rows/s (wall)", "rows per CPU second"],
                    [[label, speed[key], speed[f"{key}_cpu"]] for label, key in (
                        ("rows(), trainer columns", "trainer_columns"), ("rows(), all columns", "all_columns"),
                        ("groups(), trainer columns", "groups_trainer_columns"),
                        ("batches(), trainer columns", "batches_trainer_columns"),
                        ("batches(), all columns", "batches_all_columns"))])
        small = poll_cost(base, 100, 100, args.polls)
        big = poll_cost(base, args.big, 100, args.polls)
        print_table("one poll, 100 open writers, reader up to date", ["shards", "poll ms", "fs ops/poll", "old design: list ms"],
                    [[c["shards"], c["poll_s"] * 1e3, c["ops_per_poll"], c["old_list_s"] * 1e3] for c in (small, big)])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    emit_json({
        "tail_p99_s": round(latency["p99_s"], 3),
        "tail_p50_s": round(latency["p50_s"], 3),
        "reader_rows_per_s": round(speed["trainer_columns"]),
        "reader_rows_per_cpu_s": round(speed["trainer_columns_cpu"]),
        "reader_rows_per_s_all_columns": round(speed["all_columns"]),
        "reader_batch_rows_per_s": round(speed["batches_trainer_columns"]),
        "reader_batch_rows_per_cpu_s": round(speed["batches_trainer_columns_cpu"]),
        "batch_vs_rows_ratio": round(speed["batches_trainer_columns"] / speed["trainer_columns"], 2),
        "list_cost_ratio_1e5_vs_1e2": round(big["poll_s"] / small["poll_s"], 2),
        "ops_per_poll_1e5": big["ops_per_poll"], "ops_per_poll_1e2": small["ops_per_poll"],
        "old_design_list_ratio_1e5_vs_1e2": round(big["old_list_s"] / small["old_list_s"], 1),
    })


if __name__ == "__main__":
    main()
