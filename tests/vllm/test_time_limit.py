"""A verl step cut at its time limit leaves nothing running on a stock vLLM when it returns.

verl puts its servers to sleep right after generate_sequences; a request still generating then can
leave an async engine in an invalid state (verl's own comments). SpoolLoopManager, built by
`create()` in verl's venv (tests/verl/time_limit_driver.py), cuts a step of long generations at
its limit; right at the return the driver reads vLLM's own /metrics (`vllm:num_requests_running`
and `_waiting`), the spool's claims and pending jobs, and what meta_info says was cut. vLLM
aborts a request whose client disconnected: a cancelled job's closed connection is its abort.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.llm.registry import BackendRegistry
from tests.core.util import make_run
from tests.verl.env import verl_env
from tests.verl.test_time_limit import drive
from tests.vllm.conftest import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]
# The limit must fall while the 8 generations of 900 tokens run: they took 3.7 s on a quiet 2-core
# machine (more under load), so a limit of 5 s let a quiet run finish the step uncut (CI, 2026-11-29).
LIMIT_S, GRACE_S = 1.5, 20.0


def test_a_step_cut_at_its_limit_leaves_nothing_running_on_stock_vllm(tmp_path: Path, vllm_server: VLLMServer) -> None:
    paths = make_run(tmp_path / "run", **{"shards.max_age_s": 0.3, "shards.idle_flush_s": 0.05})
    BackendRegistry.of(paths).add(vllm_server.url, tokenizer=str(vllm_server.model_dir))
    scenario = {"name": "cut", "prompts": 4, "samples": 2, "response_length": 64, "time_limit_s": LIMIT_S,
                "cancel_grace_s": GRACE_S, "sampling": {"max_tokens": 900, "ignore_eos": True}}
    figures = drive(verl_env(tmp_path / "verl-env"), paths, vllm_server.url, tmp_path, [scenario])
    [cut] = figures["cut"]["calls"]
    assert cut["busy_at_return"] == 0, f"vLLM still running or holding requests at the return: {cut}"
    assert cut["held"] == [] and cut["pending"] == 0
    assert cut["cancelled"] == 8, f"the step was not cut at {LIMIT_S} s (its generations ended first?): {cut}"
    assert cut["missing"] == 0 and cut["seconds"] < LIMIT_S + 3.0
    said = cut["time_limit"]
    assert (said["cancelled_samples"], said["missing"], said["left_behind"], said["grace_s"]) == (8, 0, [], GRACE_S)
    assert said["still_generating"] == [], "the step waited for vLLM's own count of requests, not ours"
