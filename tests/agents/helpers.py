"""Helpers of the agent tests: the task image, runs through real local workers, rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.launches import request_stop
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.shard_reader import iter_rows
from orchestrator.spool.rundir import init_run
from orchestrator.submission.submit import submit_file
from tests.background import log_tail, wait_for_background

CLI = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


BACKGROUND_BUILD_PID = "HPC_ROLLOUT_TASK_IMAGE_BUILD_PID"   # set by scripts/test.sh
BACKGROUND_BUILD_LOG = "HPC_ROLLOUT_TASK_IMAGE_BUILD_LOG"


def task_image_path(wait_s: float = 1800.0) -> Path:
    """The bundled tasks' image (HPC_ROLLOUT_TASK_IMAGE, else built once into the cache).

    When scripts/test.sh builds it in the background, wait for that build to end first; then
    the cache holds it (or building it again here reports why it failed, with the log's tail).
    """
    from hpc_rollout.handlers.bundled.image import bundled_image

    if not os.environ.get("HPC_ROLLOUT_TASK_IMAGE"):
        wait_for_background(BACKGROUND_BUILD_PID, "task image build", wait_s)
    try:
        return bundled_image()
    except Exception as error:
        raise AssertionError(f"no task image: {error}\n{log_tail(BACKGROUND_BUILD_LOG)}") from error


def new_run(tmp_path: Path, image: Path, backend_url: str, **settings: Any) -> SpoolPaths:
    overrides = {"sandbox.image": str(image), "sandbox.runtime": "bwrap", "shards.idle_flush_s": 0.1,
                 "shards.max_age_s": 0.5, **settings}
    paths, _ = init_run(tmp_path / "run", overrides)
    BackendRegistry.of(paths).add(backend_url, protocol="vllm", version=0)
    return paths


def select(source: Path, target: Path, count: int | None = None, transform: Any = None) -> Path:
    """The first `count` rows of a task file, optionally transformed, as a new file."""
    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()][:count]
    if transform is not None:
        rows = [transform(row) for row in rows]
    target.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return target


def submit(paths: SpoolPaths, tasks: Path, handler: str, samples: int = 1, **sampling: Any) -> int:
    report = submit_file(paths, tasks, handler=handler, samples=samples, sampling=sampling)
    assert not report.rejected, report.rejected
    return report.jobs


def run_workers(paths: SpoolPaths, runtime_base: Path, workers: int = 2, timeout_s: float = 400) -> None:
    """`hpc-rollout launch --local --wait`: returns when every queued job has a row. Sandboxes
    live under `runtime_base` (so a test can check that none is left behind)."""
    env = {**os.environ, "HPC_ROLLOUT_RUNTIME_DIR": str(runtime_base / "rt"),
           "HPC_ROLLOUT_LOOPBACK_DIR": str(runtime_base / "lo")}
    process = subprocess.Popen(
        CLI + ["launch", str(paths.root), "--local", "--workers", str(workers), "--wait", "--runtime", "bwrap"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
    try:
        _, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        request_stop(paths)
        process.communicate(timeout=60)
        raise
    # 0: every job ended ok; 1: some did not (several tests fail jobs on purpose; each checks its rows).
    assert process.returncode in (0, 1), err.decode()[-3000:]
    assert b"workers ended before the queues drained" not in err, err.decode()[-3000:]


def scripts_for(sources: dict[Path, list[str]], extra: list[dict[str, Any]], target: Path) -> Path:
    """A scripts file taking, from each source file, the scripts whose `match` is listed."""
    chosen = list(extra)
    for source, matches in sources.items():
        scripts = {s["match"]: s for s in map(json.loads, source.read_text().splitlines())}
        chosen += [scripts[m] for m in matches]
    target.write_text("".join(json.dumps(s) + "\n" for s in chosen))
    return target


def rows(paths: SpoolPaths) -> list[dict[str, Any]]:
    return [row for _, batch in iter_rows(paths) for row in batch]


def by_instance(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["instance_id"]: row for row in found}
