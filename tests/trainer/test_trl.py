"""TRL's own GRPOTrainer trains on the spool (issue 40): its real `train()` loop, 3 steps, the tiny
model on CPU, rollouts by a real local worker against a real serve-llm, weights pushed to the
server after every step. Patched for this machine: nothing (use_cpu=True is a GRPOConfig setting).

Checked against the shards: every entry TRL got is its row's ids, log-probs and response mask
(multi-turn chat episodes included, their user turns masked out of the loss through env_mask,
which TRL's completion-length metric then counts), and step N's rows carry policy version N."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from orchestrator.trainer.tail import TRAINER_COLUMNS
from tests.trainer.trl_rig import digit_task, spool_with_a_worker_and_serve_llm

pytestmark = pytest.mark.llm
trl = pytest.importorskip("trl", reason="pip install 'hpc-rollout[trl]' (in the test extra: CI has it)")

STEPS, GENERATIONS = 3, 4


def task(prompt: str) -> dict[str, Any]:
    """'say 7' -> the answer handler's task; 'chat ...' -> a two-turn chat episode whose second user
    turn is an observation (env_mask 0)."""
    if prompt.startswith("chat"):
        return {"handler": "chat", "instance": {"messages": [{"role": "user", "content": prompt}],
                                                "user_turns": ["again"]}}
    return digit_task(prompt)


def test_grpo_trainer_trains_three_steps_on_spool_rollouts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from orchestrator.trainer.trl import SpoolRollout, SwapWeightsCallback, spool_reward

    with spool_with_a_worker_and_serve_llm(tmp_path) as (spool, base):
        rollout = SpoolRollout(spool, task_of=task, source_handlers={"toy/digits": "answer"},
                               sampling={"max_tokens": 3}, time_limit_s=240)
        returned: list[dict[str, list[Any]]] = []

        def recording_rollout(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
            returned.append(rollout(prompts, trainer))
            return returned[-1]

        swaps = SwapWeightsCallback(spool, tmp_path / "ckpt")
        args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=STEPS, learning_rate=1e-3,
                          per_device_train_batch_size=2 * GENERATIONS, num_generations=GENERATIONS,
                          max_completion_length=3, temperature=1.0, logging_steps=1, report_to=[], save_strategy="no",
                          bf16=False, seed=0)
        dataset = Dataset.from_list([{"prompt": "say 3"}, {"prompt": "chat hi"}, {"prompt": "say 5"}, {"prompt": "chat yo"}])
        trainer = GRPOTrainer(model=str(base), reward_funcs=[spool_reward], args=args, train_dataset=dataset,
                              rollout_func=recording_rollout, callbacks=[swaps])
        with caplog.at_level(logging.WARNING):
            trainer.train()

    assert trainer.state.global_step == STEPS and len(returned) == STEPS
    assert [s.version for s in swaps.swaps] == [1, 2, 3] and all(s.reloaded for s in swaps.swaps)
    rows = {r["job_id"]: r for r in spool.reader(columns=TRAINER_COLUMNS).rows()}
    chats: list[list[int]] = []
    for step, out in enumerate(returned):
        assert len(out["job_id"]) == 2 * GENERATIONS and out["spool_status"] == ["ok"] * (2 * GENERATIONS)
        for i, job in enumerate(out["job_id"]):
            row = rows[job]
            assert out["prompt_ids"][i] == list(row["prompt_ids"]) and out["completion_ids"][i] == list(row["response_ids"])
            assert out["env_mask"][i] == list(row["response_mask"])
            assert out["logprobs"][i] == pytest.approx(list(row["logprobs"]))
            assert out["spool_reward"][i] == row["reward"] and out["policy_version"][i] == step
        chats += [out["env_mask"][i] for i, job in enumerate(out["job_id"]) if rows[job]["handler"] == "chat"]
    assert chats and all(0 in mask and 1 in mask for mask in chats), "the chat episodes' user turns are masked"
    trained = [entry["completions/mean_length"] for entry in trainer.state.log_history if "completions/mean_length" in entry]
    sampled = [sum(map(sum, out["env_mask"])) / len(out["env_mask"]) for out in returned]
    assert trained == pytest.approx(sampled), "TRL counted the observation tokens as the model's"
    assert [s.behind for s in rollout.steps] == [0, 0, 0] and "older than step" not in caplog.text
