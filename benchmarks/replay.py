"""Replay: a filtered query over 10^6 finished rows, pushed down into the Parquet scan vs in Python.

    python -m benchmarks.replay [--quick] [--rows 1000000] [--rows-per-shard 10000] [--repeats 3]

A synthetic run of --rows rows (groups of 8, tokens of every row: a 16-token prompt and a
16-48-token response, with mask and logprobs) is written once as committed shards of
--rows-per-shard rows each, by 8 writers, and kept in a cache directory under the temp dir for
the next run. Policy versions grow with the run, as a trainer's do. The query asks what a
curriculum or replay buffer asks: the math groups of the last 5 policy versions with a sample
rewarded 1 (about 1.5% of the rows; their groups whole, about 4%).

Both sides return the same groups (checked), with the trainer's columns:
    pushdown  Spool.query: the filter evaluated in each shard's scan (row groups skipped by their
              statistics, then two Arrow passes; orchestrator/trainer/replay.py)
    python    every shard read whole with the same columns, rows made dicts, filtered and grouped
              in Python: what a trainer writes without the query
Goal: pushdown <= 1 s at 10^6 rows (best of --repeats, on a quiet machine); the ratio is
python / pushdown. Each side's CPU seconds are printed too (threads included): on a machine
loaded by others the wall seconds stretch, the CPU seconds hardly.
"""

from __future__ import annotations

import argparse
import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import emit_json, parse_args, print_table
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run
from orchestrator.spool.shard_reader import read_shard_table
from orchestrator.spool.shardlog import shard_files, shard_name
from orchestrator.trainer.replay import query_groups
from orchestrator.trainer.replay_filter import Query
from orchestrator.trainer.tail import TRAINER_COLUMNS, Row, table_rows

GOAL_S = 1.0
GROUP = 8
WRITERS = 8
VERSIONS = 50
HANDLERS = ("math", "code", "chat")
RECIPE = "v1"   # bump when the synthetic rows change: the cache is keyed by it


def _lists(lengths: np.ndarray, values: np.ndarray, kind: pa.DataType) -> pa.Array:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, kind))


def _shard(rng: np.random.Generator, first: int, n: int, rows: int) -> pa.Table:
    index = np.arange(first, first + n)
    group = index // GROUP
    response = rng.integers(16, 49, n)
    ok = rng.random(n) >= 0.05
    pass_rate = np.random.default_rng(group).random(n)   # one pass rate per group, drawn from its number
    reward = np.where(ok, (rng.random(n) < pass_rate).astype(float), np.nan)
    version = (index * VERSIONS // rows).astype(np.int64)
    ids = np.char.add("job-", np.char.zfill(index.astype(str), 8))
    return pa.table({
        "job_id": pa.array(ids), "group_id": pa.array(np.char.add("g-", np.char.zfill(group.astype(str), 7))),
        "group_size": pa.array(np.full(n, GROUP), pa.int32()), "sample_index": pa.array(index % GROUP, pa.int32()),
        "instance_id": pa.array(np.char.add("p-", (group % 5000).astype(str))),
        "handler": pa.array(np.array(HANDLERS, dtype=object)[group % len(HANDLERS)], pa.string()),
        "data_source": pa.array(np.full(n, "synthetic", dtype=object), pa.string()),
        "status": pa.array(np.where(ok, "ok", "failed").astype(object), pa.string()),
        "reward": pa.array(reward, pa.float64(), from_pandas=True),
        "prompt_ids": _lists(np.full(n, 16), rng.integers(0, 30000, n * 16), pa.int32()),
        "response_ids": _lists(response, rng.integers(0, 30000, response.sum()), pa.int32()),
        "response_mask": _lists(response, np.ones(response.sum(), np.int8), pa.int8()),
        "logprobs": _lists(response, -rng.random(response.sum()).astype(np.float32), pa.float32()),
        "policy_version_min": pa.array(version), "policy_version_max": pa.array(version),
        "worker": pa.array(np.full(n, "bench", dtype=object), pa.string()),
    })


def _own_private_dir(path: Path) -> bool:
    """A cache directory only this user could have written (never trust one someone planted)."""
    st = os.lstat(path)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def synthetic_run(rows: int, per_shard: int) -> SpoolPaths:
    """The run, from the cache when a complete one is there; written (then marked complete) otherwise."""
    cache = Path(tempfile.gettempdir()) / f"hpc-rollout-bench-{os.getuid()}"
    cache.mkdir(mode=0o700, exist_ok=True)
    if not _own_private_dir(cache):
        cache = Path(tempfile.mkdtemp(prefix="hpc-rollout-bench-"))
    root = cache / f"replay-{RECIPE}-{rows}-{per_shard}"
    paths, _ = init_run(root)
    if (root / "complete").exists():
        return paths
    for stale in shard_files(paths):
        stale.unlink()
    rng = np.random.default_rng(0)
    for seq, first in enumerate(range(0, rows, per_shard)):
        name = shard_name(f"w{seq % WRITERS}", seq // WRITERS + 1)
        pq.write_table(_shard(rng, first, min(per_shard, rows - first), rows), paths.shards / name)
    (root / "complete").write_text(f"{rows} rows\n")
    return paths


def the_query() -> Query:
    return Query(handlers=("math",), reward_min=1.0, version_min=VERSIONS - 5)


def in_python(paths: SpoolPaths) -> list[list[Row]]:
    """Every shard whole, rows as dicts, the same selection and grouping in Python."""
    everything = [row for path in shard_files(paths) for row in table_rows(read_shard_table(path, list(TRAINER_COLUMNS)))]
    chosen = {r["group_id"] for r in everything if r["handler"] == "math" and r["reward"] is not None
              and r["reward"] >= 1.0 and r["policy_version_min"] >= VERSIONS - 5}
    groups: dict[str, list[Row]] = {}
    for row in everything:
        if row["group_id"] in chosen:
            groups.setdefault(row["group_id"], []).append(row)
    return [sorted(g, key=lambda r: r["sample_index"]) for g in groups.values()]


def best_of(repeats: int, work: Callable[[], Any]) -> tuple[float, float, Any]:
    """The fastest of `repeats` runs: wall seconds, CPU seconds of this process (its threads
    included: what a quiet machine's wall time approaches on one core), the result."""
    best, result = (float("inf"), float("inf")), None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best[0], best[1], result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rows-per-shard", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, {"rows": 100_000, "repeats": 2}, argv)
    started = time.perf_counter()
    paths = synthetic_run(args.rows, args.rows_per_shard)
    prepared_s = time.perf_counter() - started
    query = the_query()
    pushdown_s, pushdown_cpu, replay = best_of(args.repeats, lambda: query_groups(paths, query))
    python_s, python_cpu, groups = best_of(1 if args.rows > 200_000 else args.repeats, lambda: in_python(paths))
    same = sorted(g[0]["group_id"] for g in replay.groups) == sorted(g[0]["group_id"] for g in groups) \
        and replay.rows == sum(len(g) for g in groups)
    if not same:
        raise SystemExit(f"the two sides disagree: {len(replay.groups)} groups vs {len(groups)}")
    ratio = python_s / pushdown_s
    load = os.getloadavg()[0]
    print(f"{args.rows:,} rows in {len(shard_files(paths))} shards ({prepared_s:.1f} s to write or find them); "
          f"query: math groups with a reward of 1 at policy version >= {VERSIONS - 5}")
    print_table("filtered query, whole groups, the trainer's columns", ("side", "seconds", "cpu s", "groups", "rows"), [
        ("pushdown (Spool.query)", f"{pushdown_s:.3f}", f"{pushdown_cpu:.3f}", len(replay.groups), replay.rows),
        ("read all, filter in Python", f"{python_s:.3f}", f"{python_cpu:.3f}", len(groups), sum(len(g) for g in groups)),
    ])
    verdict = "met" if pushdown_s <= GOAL_S else "NOT met"
    print(f"goal: pushdown <= {GOAL_S:g} s at 10^6 rows: {pushdown_s:.3f} s at {args.rows:,} rows ({verdict}); "
          f"ratio python / pushdown = {ratio:.1f}x; load average {load:.2f} on {os.cpu_count()} cores "
          f"(a loaded machine stretches wall seconds; cpu s hardly moves)")
    emit_json({"rows": args.rows, "pushdown_s": round(pushdown_s, 4), "python_s": round(python_s, 3),
               "pushdown_cpu_s": round(pushdown_cpu, 4), "python_cpu_s": round(python_cpu, 3),
               "speedup_vs_python": round(ratio, 1), "groups": len(replay.groups), "rows_returned": replay.rows,
               "rows_selected": replay.rows_selected, "goal_s": GOAL_S, "load_1min": round(load, 2)})


if __name__ == "__main__":
    main()
