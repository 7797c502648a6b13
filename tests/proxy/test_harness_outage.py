"""The job's backend dies in the middle of a harness run: a real worker (bwrap, the `tasks` image),
a scripted serve-llm of this test alone, the toy harness. After the first call the test stops the
server for good (the harness waits on a gate file in its first tool call, so the stop lands
between two calls). As every handler does after `llm.outage_wait_s` with no backend (docs/
robustness.md, 'LLM backend outages'), the job ends `failed` naming the cause; besides:
  * the harness got an OpenAI-style error (HTTP 503, {"error": {"message", "type": "server_error"}}),
    seen in its log tail;
  * the row keeps the call made before the outage, ids as the backend sampled them;
  * nothing hangs and nothing is left: no sandbox, no proxy file, no process of the command.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import orjson
import pytest

from orchestrator.devserver.local_server import start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.rundir import init_run
from tests.agents.helpers import rows, submit
from tests.core.util import start_worker, stop_worker, wait_until
from tests.proxy.conftest import needs_bwrap, proxy_leftovers, short_runtime  # noqa: F401
from tests.proxy.scripts import BOXED, tool_call
from tests.proxy.test_harness_e2e import processes_mentioning
from tests.sandbox.helpers import sandbox_processes

pytestmark = [needs_bwrap, pytest.mark.llm]

HARNESS_DIR = Path(__file__).with_name("harness")
GATE = "while [ ! -e /gate/open ]; do sleep 0.1; done; echo 391"


def test_a_backend_gone_mid_run_fails_the_job_cleanly_keeping_its_calls(task_image: Path, tmp_path: Path,
                                                                        short_runtime: Path) -> None:
    scripts = tmp_path / "scripts.jsonl"
    scripts.write_text(json.dumps({"match": "Harness outage.", "replies": [
        tool_call("bash", command=GATE), tool_call("bash", command="echo again"), BOXED]}) + "\n")
    record = tmp_path / "record.jsonl"
    server = start_server(tiny=True, record=record, extra_args=["--scripted", str(scripts)])
    marker = f"outage-{uuid.uuid4().hex[:8]}"   # the toy agent ignores extra arguments
    runtime = short_runtime
    gate = tmp_path / "gate"
    gate.mkdir()
    worker = None
    try:
        paths, _ = init_run(tmp_path / "run", {
            "sandbox.image": str(task_image), "sandbox.runtime": "bwrap", "llm.outage_wait_s": 1.0,
            "sandbox.allowed_binds": [str(HARNESS_DIR), str(gate)],
            "shards.idle_flush_s": 0.1, "shards.max_age_s": 0.5})
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=3)
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text(json.dumps({"instance_id": "outage", "problem": "Harness outage.", "answer": "391", "harness": {
            "command": f"python3 /harness/toy_agent.py {marker}", "binds": [f"{HARNESS_DIR}:/harness:ro", f"{gate}:/gate:ro"]}}) + "\n")
        submit(paths, tasks, "harness")
        worker = start_worker(paths, "--runtime", "bwrap", env={"HPC_ROLLOUT_RUNTIME_DIR": str(runtime / "rt"),
                                                                "HPC_ROLLOUT_LOOPBACK_DIR": str(runtime / "lo")})
        wait_until(lambda: record.exists() and record.read_bytes().count(b"\n") >= 1, 240, "the harness's first call")
        server.stop()
        (gate / "open").touch()
        wait_until(lambda: len(rows(paths)) == 1, 120, "the job's row")
    finally:
        server.stop()
        if worker is not None:
            assert stop_worker(worker, timeout=120) == 0
    (row,) = rows(paths)
    assert (row["status"], row["error_stage"], row["stop_reason"]) == ("failed", "run", "error")
    assert "backend" in row["error"] and "NoBackendAvailable" in row["error"], row["error"]
    result = json.loads(row["result"])
    # The toy harness prints the status and the first 300 characters of the OpenAI-style error body.
    assert """refused: 503 {"error":{"message":"the job's model backend failed: NoBackendAvailable""" \
        in result["harness_log"], result["harness_log"]
    sampled = [orjson.loads(line) for line in record.read_bytes().splitlines() if line.strip()]
    assert len(row["turns"]) == 1 and row["turns"][0]["output_ids"] == sampled[0]["output_ids"]
    assert row["response_ids"] == row["turns"][0]["output_ids"] and result["calls"] == 1
    assert proxy_leftovers(runtime) == [] and sandbox_processes(runtime) == []
    assert processes_mentioning(marker) == []
