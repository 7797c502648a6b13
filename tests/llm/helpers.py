"""Shared helpers of the LLM tests: job contexts without a worker engine, heartbeats."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from orchestrator.handler_api.context import JobContext, WorkerServices
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run


def heartbeat(paths: SpoolPaths, worker_id: str, age_s: float = 0.0) -> None:
    """Simulate a live worker (or one that went silent `age_s` ago)."""
    path = paths.heartbeat(worker_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))


def make_ctx(
    paths: SpoolPaths, worker_id: str, job_id: str, instance: dict[str, Any],
    sampling: dict[str, Any] | None = None, events: list[tuple[str, str, dict[str, Any]]] | None = None,
    router: Any = None,
) -> JobContext:
    sink = events if events is not None else []
    services = WorkerServices(
        paths=paths, worker_id=worker_id, node="testnode",
        emit=lambda job, name, fields: sink.append((job, name, fields)), llm_router=router,
    )
    job = JobSpec(job_id=job_id, group_id=job_id.rsplit("-", 1)[0], instance_id=job_id,
                  sample_index=0, handler="chat", instance=instance, sampling=sampling or {})
    return JobContext(job=job, stage=Stage.RUN, attempt=1, services=services)


def chat_instance(n_user_turns: int = 2) -> dict[str, Any]:
    return {
        "messages": [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Name a prime number."}],
        "user_turns": [f"And another one, number {i}?" for i in range(n_user_turns)],
    }


def run_dir(tmp_path: Path) -> SpoolPaths:
    """A run directory with its default run.toml (a job context outside a worker loads it)."""
    paths, _ = init_run(tmp_path / "run")
    return paths
