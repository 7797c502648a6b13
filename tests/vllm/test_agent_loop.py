"""The agent loop (orchestrator/agent) against stock vLLM: the random tiny model, real sandboxes.

An untrained model writes malformed tool calls and rambles; against vLLM (not only serve-llm)
every math/code/swe job must end `ok` with a row and a stop reason, each model token in the
row must be one vLLM sampled (checked against its answers, captured by the recording relay),
and no sandbox may be left behind.
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest

from hpc_rollout.handlers.bundled.write import Bundled
from tests.agents.conftest import bundled, needs_bwrap, task_image  # noqa: F401  (fixtures)
from tests.agents.helpers import new_run, rows, run_workers, select, submit
from tests.sandbox.conftest import private_runtime  # noqa: F401  (autouse: no sandbox left behind)
from tests.sandbox.helpers import sandbox_processes
from tests.vllm.conftest import MAX_MODEL_LEN
from tests.vllm.relay import RecordingRelay

pytestmark = [needs_bwrap, pytest.mark.vllm, pytest.mark.timeout(1800)]
STOP_REASONS = {"finished", "truncated", "max_turns", "context_full", "timeout", "error", "cancelled"}
MAX_TOKENS = 48
# The code and swe prompts (instructions + tool schemas) are 900-950 tokens of the tiny model's
# 1024: they get one turn and end context_full; math gets two.
AGENT = {"max_turns": 2, "max_context_tokens": MAX_MODEL_LEN - 24, "max_wall_s": 120, "tool_timeout_s": 10}


def test_random_model_on_stock_vllm_every_agent_job_ends_cleanly(
        tmp_path: Path, task_image: Path, bundled: Bundled, relay: RecordingRelay) -> None:  # noqa: F811
    paths = new_run(tmp_path, task_image, relay.url, **{"sandbox.allowed_binds": [str(bundled.mirrors)]})
    jobs = 0
    for family in ("math", "code", "swe"):
        subset = select(bundled.tasks(family), tmp_path / f"{family}.jsonl", 1, lambda row: {**row, "agent": AGENT})
        jobs += submit(paths, subset, family, samples=1, max_tokens=MAX_TOKENS, temperature=1.0, seed=7)
    run_workers(paths, tmp_path / "sandboxes", workers=1, timeout_s=900)

    found = rows(paths)
    assert len(found) == jobs == 3
    answered = relay.by_prompt()
    for row in found:
        assert row["status"] == "ok", (row["handler"], row["error"])
        assert row["stop_reason"] in STOP_REASONS, row["stop_reason"]
        assert row["reward"] in (0.0, 1.0)
        assert len(row["response_ids"]) == len(row["response_mask"]) == len(row["logprobs"])
        assert row["turns"], "no turn went to vLLM"
        for turn in row["turns"]:
            choice = answered[tuple(turn["input_ids"])].choice   # what vLLM answered to this very prompt
            assert turn["output_ids"] == choice["token_ids"]
            assert array("f", turn["logprobs"]) == array("f", choice["logprobs"]["token_logprobs"])
        sampled = [i for i, m in zip(row["response_ids"], row["response_mask"]) if m == 1]
        assert sampled == [t for turn in row["turns"] for t in turn["output_ids"]]
        assert len(row["prompt_ids"]) + len(row["response_ids"]) <= AGENT["max_context_tokens"] + MAX_TOKENS
        assert json.loads(row["instance"])["agent"] == AGENT
    assert sandbox_processes(tmp_path / "sandboxes") == []
