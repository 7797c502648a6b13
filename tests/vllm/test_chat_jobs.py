"""Chat jobs end to end against stock vLLM: spool, local workers, router, Parquet shards.

Every sampled id and logprob in the shards must be exactly what vLLM answered, as captured
by the recording relay between the workers and the server.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest

from orchestrator.llm.registry import BackendRegistry
from tests.llm.e2e import launch, new_run, rows, submit, wait
from tests.llm.helpers import chat_instance
from tests.vllm.relay import RecordingRelay

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

TASKS = 8


def test_shards_hold_exactly_what_vllm_sampled(tmp_path: Path, relay: RecordingRelay) -> None:
    paths = new_run(tmp_path)
    tasks = []
    for index in range(TASKS):
        instance = chat_instance(2)                       # 3 turns: the question and 2 follow-ups
        instance["messages"][-1]["content"] += f" (question {index})"
        instance["sampling"] = {"max_tokens": 12, "seed": index}
        tasks.append(instance)
    BackendRegistry.of(paths).add(relay.url, version=4)
    submit(paths, tasks)
    wait(paths, launch(paths, 2, 4), timeout_s=900)

    answered = relay.by_prompt()
    found = rows(paths)
    assert len(found) == TASKS and all(r["status"] == "ok" for r in found), [r["error"] for r in found]
    assert len(answered) == sum(len(r["turns"]) for r in found) == TASKS * 3   # nothing asked twice
    for row in found:
        for index, turn in enumerate(row["turns"]):
            sent = answered[tuple(turn["input_ids"])]
            choice = sent.choice
            assert choice["prompt_token_ids"] == turn["input_ids"]
            assert turn["output_ids"] == choice["token_ids"]
            # Shards keep logprobs as float32: equal to vLLM's value cast the same way.
            assert array("f", turn["logprobs"]) == array("f", choice["logprobs"]["token_logprobs"])
            assert turn["finish_reason"] == choice["finish_reason"]
            assert turn["backend"] == relay.url and turn["policy_version"] == 4
            if index:  # a later turn extends the previous ids verbatim: nothing re-tokenized
                previous = row["turns"][index - 1]
                prefix = previous["input_ids"] + previous["output_ids"]
                assert turn["input_ids"][: len(prefix)] == prefix
        last = row["turns"][-1]
        assert list(row["prompt_ids"]) + list(row["response_ids"]) == last["input_ids"] + last["output_ids"]
        sampled = [i for i, m in zip(row["response_ids"], row["response_mask"]) if m == 1]
        assert sampled == [t for turn in row["turns"] for t in turn["output_ids"]]
        assert row["policy_version_min"] == row["policy_version_max"] == 4
