"""Helpers of the end-to-end tests: real serve-llm backends, real local workers, real rows."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.llm.inflight import read_load
from orchestrator.spool.launches import request_stop
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shard_reader import iter_rows
from orchestrator.spool.rundir import init_run
from orchestrator.submission.submit import submit_rows

CLI = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


def new_run(tmp_path: Path) -> SpoolPaths:
    paths, _ = init_run(tmp_path / "run")
    return paths


def heavy_tailed_tasks(count: int, seed: int = 0, shortest: int = 4) -> list[dict[str, Any]]:
    """Chat tasks whose reply budgets follow a Pareto tail from `shortest` tokens (most short, a few
    long), at most 96."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        max_tokens = min(96, int(shortest * rng.paretovariate(1.2)))
        turns = rng.choice([1, 2, 3])
        tasks.append({
            "messages": [{"role": "user", "content": f"Task {index}: say something."}],
            "user_turns": [f"Go on ({k})." for k in range(turns)],
            "sampling": {"max_tokens": max_tokens},
        })
    return tasks


def submit(paths: SpoolPaths, tasks: list[dict[str, Any]]) -> None:
    report = submit_rows(paths, enumerate(tasks, 1), handler="chat", sampling={"temperature": 1.0})
    assert report.jobs == len(tasks), report


def launch(paths: SpoolPaths, workers: int, run_pool: int) -> subprocess.Popen[bytes]:
    """`hpc-rollout launch --local --wait`: returns when every job is finished."""
    return subprocess.Popen(
        CLI + ["launch", str(paths.root), "--local", "--workers", str(workers), "--wait",
               "--run-pool", str(run_pool), "--runtime", "local"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )


def rows(paths: SpoolPaths) -> list[dict[str, Any]]:
    return [row for _, batch in iter_rows(paths) for row in batch]


@dataclass
class LoadSampler:
    """Samples cluster-wide in-flight counts per backend while workers run."""

    paths: SpoolPaths
    period_s: float = 0.05
    samples: list[dict[str, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> "LoadSampler":
        def loop() -> None:
            while not self._stop.is_set():
                self.samples.append(read_load(self.paths).inflight)
                time.sleep(self.period_s)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(5)


def wait(paths: SpoolPaths, process: subprocess.Popen[bytes], timeout_s: float = 240) -> None:
    try:
        _, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        request_stop(paths)  # the workers drain and exit; then the launcher returns
        process.communicate(timeout=60)
        raise
    assert process.returncode == 0, err.decode()[-2000:]
