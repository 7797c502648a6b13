"""The shared server's weights can be swapped in place (vLLM dev mode) and are put back after.

What the weight-reload tests of the trainer build on: `reload_weights` changes what the
server computes without a restart, and `restored_weights` leaves the tiny model in place.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.vllm.conftest import VLLMServer, reload_weights

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

PROMPT = [1, 2069, 205, 1998, 2, 205, 1, 3386, 907, 826, 205]


def greedy_logprobs(server: VLLMServer) -> list[float]:
    answer = httpx.post(f"{server.url}/completions", timeout=120, json={
        "model": str(server.model_dir), "prompt": PROMPT, "max_tokens": 4, "temperature": 0.0,
        "logprobs": 0, "return_token_ids": True}).json()
    return answer["choices"][0]["logprobs"]["token_logprobs"]


def scaled_copy(model_dir: Path, target: Path, factor: float) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, target)
    weights = load_file(target / "model.safetensors")
    save_file({name: tensor * factor for name, tensor in weights.items()}, target / "model.safetensors",
              metadata={"format": "pt"})
    return target


def test_reloaded_weights_change_the_answer_and_are_put_back(tmp_path: Path, vllm_server: VLLMServer) -> None:
    before = greedy_logprobs(vllm_server)
    scaled = scaled_copy(vllm_server.model_dir, tmp_path / "scaled", 3.0)
    reload_weights(vllm_server.url, scaled)
    try:
        changed = greedy_logprobs(vllm_server)
    finally:
        reload_weights(vllm_server.url, vllm_server.model_dir)   # what `restored_weights` does
    assert max(abs(a - b) for a, b in zip(before, changed)) > 1e-2
    assert greedy_logprobs(vllm_server) == before
