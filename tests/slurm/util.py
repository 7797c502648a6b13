"""Helpers for the tests that launch node workers on the real cluster."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds

from orchestrator.spool.events import events_named as events  # noqa: F401  (re-exported for the tests)
from orchestrator.spool.paths import SpoolPaths
from tests.core.util import cli, make_run, wait_until, write_jsonl

# Heartbeats every second, leases of 15 s: quick enough, and safe on a busy 2-core machine.
SLURM_RUN = {"leases.heartbeat_s": 1.0, "leases.lease_s": 15.0, "shutdown.grace_s": 10.0}


def sleep_run(root: Path, jobs: int, run_s: float) -> SpoolPaths:
    paths = make_run(root, **SLURM_RUN)
    tasks = write_jsonl(root.parent / "tasks.jsonl", [{"handler": "sleep", "instance": {"run": run_s}}] * jobs)
    cli("submit", str(paths.root), str(tasks))
    return paths


def launch(paths: SpoolPaths, *args: str) -> tuple[str, str]:
    """`hpc-rollout launch RUN --nodes ...`; returns (array id, stdout)."""
    out = cli("launch", str(paths.root), "--time", "00:30:00", *args).stdout
    match = re.search(r"Slurm array (\d+)", out)
    assert match, out
    return match.group(1), out


def rows(paths: SpoolPaths) -> dict[str, list[Any]]:
    # Shards being written are hidden (_tmp-*): pyarrow skips them, so must this check.
    if not [p for p in paths.shards.glob("*.parquet") if not p.name.startswith(("_", "."))]:
        return {"job_id": [], "status": [], "node": [], "worker": [], "attempt": []}
    return ds.dataset(paths.shards).to_table(columns=["job_id", "status", "node", "worker", "attempt"]).to_pydict()


def wait_rows(paths: SpoolPaths, count: int, timeout: float = 300) -> dict[str, list[Any]]:
    wait_until(lambda: len(rows(paths)["job_id"]) >= count, timeout, f"{count} shard rows")
    return rows(paths)


def heartbeats(paths: SpoolPaths) -> list[dict[str, Any]]:
    return [orjson.loads(p.read_bytes()) for p in paths.workers.glob("*.json")]


def queued(job_id: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-r", "-j", job_id, "-o", "%i"], capture_output=True, text=True).stdout
    return out.split()


def logs_containing(paths: SpoolPaths, text: str) -> list[Path]:
    return [p for p in paths.logs.glob("*/*_log.*") if text in p.read_text(errors="replace")]


def exactly_once(table: dict[str, list[Any]], jobs: int) -> None:
    counts = Counter(table["job_id"])
    assert len(counts) == jobs and max(counts.values()) == 1, counts.most_common(3)
    assert set(table["status"]) == {"ok"}, Counter(table["status"])
