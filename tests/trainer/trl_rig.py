"""What the TRL tests share: a spool with one local worker and serve-llm on the tiny digits model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.app.local_launch import start_local_workers
from orchestrator.devserver.local_server import start_server
from orchestrator.devserver.tiny_model import tiny_digits_model_dir
from orchestrator.llm.registry import BackendRegistry
from orchestrator.trainer.api import Spool
from orchestrator.worker.options import WorkerOptions

# Rows committed within ~10 ms of finishing: a trainer step waits for them.
SETTINGS = {"shards.idle_flush_s": 0.01, "shards.max_age_s": 0.2, "leases.heartbeat_s": 1.0, "llm.health_check_s": 0}


def digit_task(prompt: str) -> dict[str, Any]:
    """'say 7' -> the answer handler's task: reward 1.0 when the reply starts with 7."""
    return {"data_source": "toy/digits", "prompt": prompt, "match": "prefix",
            "reward_model": {"style": "rule", "ground_truth": prompt[-1]}}


@contextmanager
def spool_with_a_worker_and_serve_llm(directory: Path) -> Iterator[tuple[Spool, Path]]:
    """(the spool, the model directory), backend registered at version 0; everything stopped after."""
    base = tiny_digits_model_dir()
    spool = Spool.create(directory / "spool", **SETTINGS)
    launch = start_local_workers(spool.paths, 1, WorkerOptions(runtime="local", idle_exit_s=0), verbose=0)
    server = None
    try:
        server = start_server(tiny=False, model_dir=base, log_path=directory / "serve-llm.log")
        BackendRegistry(spool.paths).add(server.url, version=0)
        yield spool, base
    finally:
        launch.terminate(timeout_s=30)
        if server is not None:
            server.stop()
