"""Warm the workers before verl's first step, so that the first batch runs like the next ones.

A fresh worker pays once, in its first jobs, what no later job pays: importing transformers and
loading the tokenizer (4-15 s per worker process measured here, on 2 busy cores), importing the
handler and its grader (verl's scorers: 1-11 s), opening the sandbox image, and the model server's
first forward passes. Under a `time_limit_s` sized on warm steps that cancelled the whole first
batch (issue 35: 41 s for the first call, 3 s warm).

`SpoolLoopManager.create()` therefore runs real jobs first: one row of each data source of verl's
own data files (data.val_files, then data.train_files; validation may come first), routed and
scored as the steps' rows will be, sampling WARM_UP_TOKENS tokens each, as many as the live
workers have INIT + RUN slots (single tickets, so every worker takes some), for `warm_up_s` (120 s)
at most: what is left then is cancelled like a step at its time limit. Their rows are read and
dropped; the first step then starts on warm workers and its time limit counts only its own work.
No warm-up when no worker is alive (nothing to warm) or every live worker has finished a job already.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.spool.liveness import read_workers
from orchestrator.trainer.api import Spool
from orchestrator.trainer.verl.settings import ManagerSettings
from orchestrator.trainer.time_limit import GroupSlots, RowSource, collect

log = logging.getLogger(__name__)

WARM_UP_TOKENS = 2            # enough for a reply the handler can score
MAX_SOURCES = 8               # data sources warmed (each may route to another handler)
MAX_JOBS = 512
# A verl row for the configured handler, when verl's data files cannot be read here.
FALLBACK_ROW = {"data_source": "hpc_rollout/warm_up", "prompt": [{"role": "user", "content": "What is 1 + 1?"}],
                "ability": "warm_up", "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {}}


@dataclass
class WarmUp:
    jobs: int = 0
    workers: int = 0
    seconds: float = 0.0
    ok: int = 0
    failures: list[str] = field(default_factory=list)   # the first reasons, one per distinct error
    skipped: str = ""                                   # why there was none


def warm_up_rows(config: Mapping[str, Any], handler: str | None) -> list[dict[str, Any]]:
    """The first row of each data source in verl's local parquet data files; else a plain row for
    `handler`; else none."""
    data = config.get("data") or {}
    files: list[str] = []
    for key in ("val_files", "train_files"):
        value = data.get(key) if isinstance(data, Mapping) else None
        files += [value] if isinstance(value, str) else [str(v) for v in value or ()]
    found: dict[Any, dict[str, Any]] = {}
    for name in files:
        path = Path(name).expanduser()
        if path.suffix == ".parquet" and path.is_file() and len(found) < MAX_SOURCES:
            try:
                firsts = first_row_per_source(path, MAX_SOURCES)
            except (OSError, ValueError) as exc:   # pyarrow's errors are these: the warm-up does without
                log.info("warm-up: cannot take rows from %s: %s", path, exc)
                continue
            for source, row in firsts.items():
                found.setdefault(source, row)
    if found:
        return list(found.values())[:MAX_SOURCES]
    return [dict(FALLBACK_ROW)] if handler else []


def first_row_per_source(path: Path, limit: int) -> dict[Any, dict[str, Any]]:
    """{data_source: its first row} of a verl parquet file: the data_source column is read whole,
    the rows wanted are taken from a stream of record batches (a large file is never loaded)."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    if "data_source" not in parquet.schema_arrow.names:
        return {}
    first: dict[Any, int] = {}
    for index, source in enumerate(parquet.read(columns=["data_source"]).column("data_source").to_pylist()):
        if source not in first:
            first[source] = index
            if len(first) >= limit:
                break
    wanted = {index: source for source, index in first.items()}
    rows: dict[Any, dict[str, Any]] = {}
    offset = 0
    for batch in parquet.iter_batches(batch_size=1024):
        for index in [i for i in wanted if offset <= i < offset + batch.num_rows]:
            rows[wanted.pop(index)] = batch.slice(index - offset, 1).to_pylist()[0]
        offset += batch.num_rows
        if not wanted:
            break
    return rows


def warm_up(spool: Spool, reader: RowSource, rows: Sequence[Mapping[str, Any]], settings: ManagerSettings,
            sampling: Mapping[str, Any]) -> WarmUp:
    """Run the warm-up jobs and wait for their rows (module doc); what it did."""
    alive = [w for w in read_workers(spool.paths, spool.config.leases.lease_s) if w.alive]
    if settings.warm_up_s <= 0:
        return WarmUp(skipped="hpc_rollout.warm_up_s = 0")
    if not rows:
        return WarmUp(skipped="no data file to take rows from and no hpc_rollout.handler")
    if not alive:
        return WarmUp(skipped="no live worker")
    if all(_counter(w.info, "finished") > 0 for w in alive):
        return WarmUp(workers=len(alive), skipped="every live worker has finished jobs already")
    slots = sum(_pool_size(w.info, "init") + _pool_size(w.info, "run") for w in alive)
    samples = max(1, min(slots, MAX_JOBS // len(rows)))
    spec = settings.reward_spec()
    tasks = [{**row, "verl_reward": spec} if spec is not None else dict(row) for row in rows]
    started = time.monotonic()
    report = spool.submit(tasks, handler=settings.handler, samples=samples, sampling=dict(sampling),
                          source_handlers=dict(settings.source_handlers) or None, batch_size=1)
    problems = [f"row {p.line}: {p.reason}" for p in report.rejected]
    if report.error or not report.jobs:
        return WarmUp(workers=len(alive), skipped=f"its rows were refused: {report.error or '; '.join(problems[:3])}")
    placement = GroupSlots.of(report.submission_id, report.tasks, samples)   # the accepted rows, in order
    found, _ = collect(reader, placement, report.jobs, spool.paths,
                       lambda groups: spool.cancel(groups=groups), settings.warm_up_s, settings.cancel_grace_s,
                       settings.poll_s, started)
    done = WarmUp(jobs=report.jobs, workers=len(alive), seconds=time.monotonic() - started,
                  failures=[f"{problem} (refused)" for problem in problems[:3]])
    for row in found:
        if row is not None and row.get("status") == "ok":
            done.ok += 1
        elif row is not None and len(done.failures) < 3 and str(row.get("error")) not in done.failures:
            done.failures.append(str(row.get("error"))[:300])
    return done


def _pool_size(info: Mapping[str, Any], stage: str) -> int:
    pool = (info.get("pools") or {}).get(stage) or {}
    size = pool.get("size") if isinstance(pool, Mapping) else None
    return size if isinstance(size, int) and size > 0 else 0


def _counter(info: Mapping[str, Any], name: str) -> int:
    value = (info.get("counters") or {}).get(name)
    return value if isinstance(value, int) else 0
