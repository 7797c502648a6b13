"""An abort on weight swap against a stock vLLM (dev mode /abort_requests): the generation in flight
answers what it sampled with finish reason `abort`, and the job resumes it on the new weights as
its next request; one reply, two records, nothing sampled twice."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from orchestrator.devserver.tiny_model import save_perturbed_copy
from orchestrator.llm.registry import BackendRegistry
from orchestrator.trainer.api import Spool
from tests.core.util import FAST, rows, start_worker, stop_worker, wait_drained, wait_until
from tests.vllm.conftest import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]
BUDGET = 1000   # several seconds of generation on this CPU: long enough to be cut


def running(server: VLLMServer) -> float:
    page = httpx.get(server.url.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in page.splitlines() if line.startswith("vllm:num_requests_running"))


def test_abort_on_swap_resumes_the_reply_on_stock_vllm(tmp_path: Path, restored_weights: VLLMServer) -> None:
    server = restored_weights
    spool = Spool.create(tmp_path / "run", **FAST, **{"trainer.staleness": "continue"})
    BackendRegistry(spool.paths).add(server.url, version=0)
    checkpoint = save_perturbed_copy(server.model_dir, tmp_path / "ckpt-1", seed=5, scale=0.05)
    spool.submit([{"messages": [{"role": "user", "content": "Tell me a long story."}]}], handler="chat",
                 sampling={"max_tokens": BUDGET, "ignore_eos": True})
    worker = start_worker(spool.paths)
    try:
        wait_until(lambda: running(server) > 0, 600, "the generation to start")
        time.sleep(0.5)
        report = spool.swap_weights(checkpoint, version=1, max_policy_lag=-1)   # abort: staleness is continue
        wait_drained(spool.paths, timeout=600)
    finally:
        stop_worker(worker)
    assert report.aborted == {server.url: 1} and not report.abort_unsupported
    [row] = rows(spool.paths)
    assert row["status"] == "ok", row["error"]
    first, second = row["turns"]
    assert (first["finish_reason"], first["policy_version"]) == ("abort", 0) and 0 < len(first["output_ids"]) < BUDGET
    assert len(first["logprobs"]) == len(first["output_ids"])
    assert (second["finish_reason"], second["policy_version"]) == ("length", 1)
    assert list(second["input_ids"]) == list(first["input_ids"]) + list(first["output_ids"])
    assert len(first["output_ids"]) + len(second["output_ids"]) == BUDGET == sum(row["response_mask"])
