"""spool.swap_weights on a stock vLLM: the client path serve-llm answers is the one vLLM answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.api import Spool
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.tiny_model import save_perturbed_copy
from tests.vllm.conftest import VLLMServer
from tests.vllm.test_weights import greedy_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]


def test_swap_weights_reloads_a_stock_vllm_then_moves_the_version(tmp_path: Path, restored_weights: VLLMServer) -> None:
    server = restored_weights
    spool = Spool.create(tmp_path / "run")
    BackendRegistry(spool.paths).add(server.url, version=0, model=str(server.model_dir))
    before = greedy_logprobs(server)
    checkpoint = save_perturbed_copy(server.model_dir, tmp_path / "ckpt-1", seed=3, scale=0.05)
    report = spool.swap_weights(checkpoint, version=1, max_policy_lag=1)
    assert report.reloaded == (server.url,)
    snapshot = BackendRegistry(spool.paths).read()
    assert (snapshot.policy_version, snapshot.min_policy_version, snapshot.backends[0].policy_version) == (1, 0, 1)
    assert max(abs(a - b) for a, b in zip(before, greedy_logprobs(server))) > 1e-3
    print(f"reload_s on stock vLLM: {report.seconds:.3f}")
