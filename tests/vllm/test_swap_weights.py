"""`backend swap --reload` on a stock vLLM while chat jobs run: the trainer issue's reload, for real.

The jobs go through the recording relay. Once two turns are answered, the relay holds the
answers vLLM has sampled (those jobs are in flight, waiting on a turn sampled with the old
weights) while `hpc-rollout backend swap --reload` asks vLLM to load the new checkpoint
(/collective_rpc reload_weights, dev mode) and moves the policy version. Every job must
finish ok; turns sent after the swap must carry the new version, turns sent before it the
old one; the same prompt, greedy, must get other logprobs from vLLM after the swap.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.trainer.api import Spool
from orchestrator.llm.registry import BackendRegistry
from orchestrator.devserver.tiny_model import save_perturbed_copy
from tests.core.util import FAST, cli, rows, start_worker, stop_worker, wait_drained, wait_until
from tests.llm.helpers import chat_instance
from tests.vllm.conftest import VLLMServer
from tests.vllm.relay import RecordingRelay
from tests.vllm.test_weights import greedy_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

JOBS = 6
TURNS = 5   # the question and four follow-ups


def test_backend_swap_reload_while_chat_jobs_run_on_stock_vllm(
        tmp_path: Path, restored_weights: VLLMServer, relay: RecordingRelay) -> None:
    server = restored_weights
    spool = Spool.create(tmp_path / "run", **{**FAST, "pools.run": JOBS})
    BackendRegistry(spool.paths).add(relay.url, version=0)
    before = greedy_logprobs(server)
    checkpoint = save_perturbed_copy(server.model_dir, tmp_path / "ckpt-1", seed=3, scale=0.05)
    tasks = []
    for index in range(JOBS):
        task = chat_instance(TURNS - 1)
        task["messages"][-1]["content"] += f" (job {index})"
        tasks.append(task)
    spool.submit(tasks, handler="chat", sampling={"max_tokens": 8})
    worker = start_worker(spool.paths)
    try:
        wait_until(lambda: len(relay.completions()) >= 2, 600, "the first turns")
        with relay.holding_answers():
            # A held answer is at most a job's third turn: that job has turns after the swap.
            wait_until(lambda: relay.held >= 1, 600, "a turn in flight")
            asked = time.time()
            swapped = cli("backend", "swap", str(spool.paths.root), "--reload", str(checkpoint), "--version", "1",
                          "--max-policy-lag", "1", timeout=600)
            confirmed = time.time()
            in_flight = relay.held
        wait_drained(spool.paths, timeout=600)
    finally:
        stop_worker(worker)
    after = greedy_logprobs(server)

    assert "policy version 1: 1 backend(s) loaded" in swapped.stdout, swapped.stdout
    snapshot = BackendRegistry(spool.paths).read()
    assert (snapshot.policy_version, snapshot.min_policy_version, snapshot.backends[0].policy_version) == (1, 0, 1)
    finished = rows(spool.paths)
    assert len(finished) == JOBS and {r["status"] for r in finished} == {"ok"}, [r["error"] for r in finished]
    assert all(len(r["turns"]) == TURNS for r in finished)
    turns = [t for r in finished for t in r["turns"]]
    assert all(t["policy_version"] == 1 for t in turns if t["sent_at"] > confirmed)
    assert all(t["policy_version"] == 0 for t in turns if t["sent_at"] < asked)
    spanning = [r for r in finished if {t["policy_version"] for t in r["turns"]} == {0, 1}]
    assert in_flight >= 1 and spanning, "no job was in flight across the swap"
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-3, "vLLM's logprobs did not change"
    print(f"swap on stock vLLM with {in_flight} turn(s) in flight: {swapped.stdout.strip()}")
