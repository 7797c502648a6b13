"""The TRL adapter's parts that need no TRL: grouping TRL's repeated prompts, entries for samples
that failed or never came, the sampling taken from GRPOConfig, the off-policy warning."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from orchestrator.trainer.api import Spool
from orchestrator.trainer.trl.groups import by_size, chat_task, equal_prompts
from orchestrator.trainer.trl.rollout import SpoolRollout, trainer_sampling
from orchestrator.trainer.trl.samples import Samples, samples_of


def test_repeated_prompts_become_one_group_each_in_order_of_first_appearance() -> None:
    chat = [{"role": "user", "content": "hi"}]
    prompts = ["a", "a", chat, "b", chat, "a", "b", list(chat)]
    assert equal_prompts(prompts) == [[0, 1, 5], [2, 4, 7], [3, 6]]
    assert by_size(equal_prompts(prompts)) == {3: [[0, 1, 5], [2, 4, 7]], 2: [[3, 6]]}
    assert chat_task("a") == {"handler": "chat", "instance": {"messages": [{"role": "user", "content": "a"}]}}


def test_a_failed_or_missing_sample_is_a_masked_eos_with_reward_zero_and_its_siblings_prompt() -> None:
    ok = {"job_id": "j0", "status": "ok", "reward": 1.0, "prompt_ids": np.array([5, 6]), "response_ids": np.array([7, 8, 9]),
          "logprobs": np.array([-0.5, 0.0, -0.25]), "response_mask": np.array([1, 0, 1]), "policy_version_min": 2}
    failed = {"job_id": "j1", "status": "failed", "reward": None, "prompt_ids": None, "response_ids": None,
              "logprobs": None, "response_mask": None, "policy_version_min": None}
    rendered: list[int] = []
    out = samples_of([ok, failed, None], [0, 0, 1], lambda i: rendered.append(i) or [40 + i], eos_id=2)
    assert out.prompt_ids == [[5, 6], [5, 6], [42]] and rendered == [2]   # a sibling's prompt, else rendered
    assert out.completion_ids == [[7, 8, 9], [2], [2]] and out.env_mask == [[1, 0, 1], [0], [0]]
    assert out.logprobs == [[-0.5, 0.0, -0.25], [0.0], [0.0]] and out.spool_reward == [1.0, 0.0, 0.0]
    assert out.spool_status == ["ok", "failed", "missing"] and out.policy_version == [2, -1, -1]
    assert set(out.to_trl()) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask", "spool_reward", "job_id"}


def test_sampling_comes_from_the_trainers_config() -> None:
    args = SimpleNamespace(temperature=0.7, top_p=0.9, top_k=0, max_completion_length=64)
    assert trainer_sampling(SimpleNamespace(args=args)) == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 64}
    args.top_k = 20
    assert trainer_sampling(SimpleNamespace(args=args))["top_k"] == 20


def test_samples_of_an_older_policy_are_counted_and_warned_about_once_without_the_threshold(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rollout = SpoolRollout(Spool.create(tmp_path / "spool"))
    behind = Samples(job_id=["a", "b", "c"], spool_status=["ok"] * 3, policy_version=[1, 3, -1])
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=3), args=SimpleNamespace(off_policy_mask_threshold=None))
    with caplog.at_level(logging.WARNING):
        rollout._record(behind, trainer, 1, 0.1, None)
        rollout._record(behind, trainer, 1, 0.1, None)
    assert [s.behind for s in rollout.steps] == [1, 1]
    assert caplog.text.count("off_policy_mask_threshold") == 1, caplog.text
    caplog.clear()
    guarded = SpoolRollout(Spool.create(tmp_path / "spool2"))
    trainer.args.off_policy_mask_threshold = 0.5
    with caplog.at_level(logging.WARNING):
        guarded._record(behind, trainer, 1, 0.1, None)
    assert "off_policy_mask_threshold" not in caplog.text
