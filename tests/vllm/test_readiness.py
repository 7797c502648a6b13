"""Readiness is one real token, because stock vLLM's /health says OK for a model it cannot run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from orchestrator.devserver.local_server import signal_group
from orchestrator.llm.readiness import ServerNotReady, wait_until_serving
from orchestrator.devserver.stock_vllm import CPU_ENV, free_port, server_command, server_temp_directory, server_temp_env
from orchestrator.devserver.tiny_model import tiny_model_dir
from tests.core.util import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url.removesuffix('/v1')}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_health_ok_is_not_ready_for_a_model_the_cpu_backend_cannot_run(tmp_path: Path, vllm_python: Path) -> None:
    # The tiny model's weights with 4 heads of size 16: same shapes, an attention CPU vLLM lacks.
    model = tmp_path / "head16"
    shutil.copytree(tiny_model_dir(), model)
    config = json.loads((model / "config.json").read_text())
    config.update(num_attention_heads=4, num_key_value_heads=2)
    (model / "config.json").write_text(json.dumps(config))

    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    log_path = tmp_path / "server.log"
    scratch = server_temp_directory()    # vLLM's temp files (sockets, file store), removed below
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | CPU_ENV | server_temp_env(scratch)
    with open(log_path, "wb") as log:
        server = subprocess.Popen(server_command(vllm_python, model, port, 256), stdout=log,
                                  stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_until(lambda: healthy(url) or server.poll() is not None, 1200, "/health to answer")
        assert healthy(url), log_path.read_text(errors="replace")[-3000:]   # it says it is fine...
        with pytest.raises(ServerNotReady):                                  # ...but completes nothing
            wait_until_serving(url, timeout_s=300, pid=server.pid)
    finally:
        signal_group(server.pid, signal.SIGKILL)
        server.wait(60)
        shutil.rmtree(scratch, ignore_errors=True)
    assert "head_dim=16" in log_path.read_text(errors="replace")
