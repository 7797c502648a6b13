"""Cancelling harness jobs leaves nothing of their proxies: a real worker (bwrap, the `tasks`
image, one RUN slot), two harness jobs that would run two minutes. The first runs (its relay and
command live in its sandbox), the second is prepared by INIT and waits in the node's run queue.
Cancelling the waiting one, then the running one: both rows say `cancelled`, and no proxy socket,
token or directory, no sandbox and no process of either command is left."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from orchestrator.cancel import request_cancel
from orchestrator.llm.registry import BackendRegistry
from orchestrator.paths import SpoolPaths
from orchestrator.spool import init_run
from tests.agents.helpers import rows, submit
from tests.core.util import start_worker, stop_worker, wait_until
from tests.proxy.conftest import Backend, needs_bwrap, proxy_leftovers, short_runtime  # noqa: F401
from tests.sandbox.helpers import sandbox_processes

pytestmark = [needs_bwrap, pytest.mark.llm]


def events(paths: SpoolPaths) -> list[dict[str, Any]]:
    found = []
    for log in paths.events.glob("*.jsonl"):
        found += [orjson.loads(line) for line in log.read_bytes().splitlines() if line.strip()]
    return found


def processes_mentioning(marker: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                shown = cmdline.replace(b"\0", b" ").decode(errors="replace")[:160]
                found.append(f"{entry}: {shown}")
    return found


def test_cancel_before_and_during_run_leaves_no_proxy(backend: Backend, task_image: Path, tmp_path: Path,
                                                      short_runtime: Path) -> None:
    paths, _ = init_run(tmp_path / "run", {"sandbox.image": str(task_image), "sandbox.runtime": "bwrap",
                                           "shards.idle_flush_s": 0.1, "shards.max_age_s": 0.5})
    BackendRegistry.of(paths).add(backend.server.url, protocol="vllm", version=3)
    marker = f"harness-cancel-{uuid.uuid4().hex[:8]}"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({
        "instance_id": name, "problem": "Wait.", "answer": "1",
        "harness": {"command": f"sleep 120 # {marker}"}}) + "\n" for name in ("first", "second")))
    submit(paths, tasks, "harness")
    runtime = short_runtime
    worker = start_worker(paths, "--run-pool", "1", "--init-pool", "1", "--max-prepared", "1", "--runtime", "bwrap",
                          env={"HPC_ROLLOUT_RUNTIME_DIR": str(runtime / "rt"), "HPC_ROLLOUT_LOOPBACK_DIR": str(runtime / "lo")})
    try:
        def prepared_and_running() -> tuple[set[str], set[str]]:
            seen = events(paths)
            return ({e["job"] for e in seen if e["event"] == "init_finished"},
                    {e["job"] for e in seen if e["event"] == "run_started"})

        wait_until(lambda: len(prepared_and_running()[0]) == 2 and len(prepared_and_running()[1]) == 1, 240,
                   "one harness job running and the other prepared, waiting for the RUN slot")
        wait_until(lambda: bool(processes_mentioning(marker)), 60, "the running job's command")
        prepared, running = prepared_and_running()
        (waiting,) = prepared - running
        request_cancel(paths, (waiting,))
        wait_until(lambda: len(rows(paths)) == 1, 120, "the row of the job cancelled before RUN")
        request_cancel(paths, tuple(running))
        wait_until(lambda: len(rows(paths)) == 2, 120, "the row of the job cancelled during RUN")
    finally:
        assert stop_worker(worker, timeout=120) == 0
    by_job = {r["job_id"]: r for r in rows(paths)}
    assert by_job[waiting]["status"] == "cancelled" and by_job[waiting]["error_stage"] == "run"
    (running_id,) = running
    assert by_job[running_id]["status"] == "cancelled" and by_job[running_id]["stop_reason"] == "cancelled"
    assert proxy_leftovers(runtime) == []
    assert sandbox_processes(runtime) == [] and processes_mentioning(marker) == []
