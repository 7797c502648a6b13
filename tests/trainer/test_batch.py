"""GroupBatcher on a case small enough to check by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.trainer import GroupBatcher

PAD = 0
S = 1 / math.sqrt(2)   # |(r - mean) / std| for two samples with different rewards (unbiased std)


def groups() -> list[list[dict]]:
    a = {"job_id": "a", "group_id": "g1", "status": "ok", "reward": 1.0, "prompt_ids": [5, 6],
         "response_ids": [7, 8, 9], "response_mask": [1, 0, 1], "logprobs": [-0.1, 0.0, -0.3]}
    b = {"job_id": "b", "group_id": "g1", "status": "ok", "reward": 0.0, "prompt_ids": [5, 6],
         "response_ids": [7], "response_mask": [1], "logprobs": [-0.2]}
    c = {"job_id": "c", "group_id": "g2", "status": "ok", "reward": 0.5, "prompt_ids": [4],
         "response_ids": np.array([1, 2], dtype=np.int32), "response_mask": np.array([1, 1], dtype=np.int8),
         "logprobs": np.array([-0.5, -0.6], dtype=np.float32)}
    d = {"job_id": "d", "group_id": "g2", "status": "timeout", "reward": None, "prompt_ids": [4],
         "response_ids": None, "response_mask": None, "logprobs": None}
    return [[a, b], [c, d]]


def test_padded_arrays_masks_and_grpo_advantages_by_hand() -> None:
    batch = GroupBatcher(pad_id=PAD).build(groups())
    t = batch.numpy()
    assert batch.job_ids == ["a", "b", "c", "d"]
    assert t["prompts"].tolist() == [[5, 6], [5, 6], [PAD, 4], [PAD, 4]]          # left-padded
    assert t["responses"].tolist() == [[7, 8, 9], [7, PAD, PAD], [1, 2, PAD], [PAD, PAD, PAD]]
    assert t["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, PAD, PAD], [PAD, 4, 1, 2, PAD], [PAD, 4, PAD, PAD, PAD]]
    assert t["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 1, 0, 0, 0]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 2, 2], [0, 0, 1, 2, 2], [0, 0, 0, 0, 0]]
    assert t["response_mask"].tolist() == [[1, 0, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]]
    assert np.allclose(t["old_logprobs"], [[-0.1, 0, -0.3], [-0.2, 0, 0], [-0.5, -0.6, 0], [0, 0, 0]])
    assert t["rewards"].tolist() == [1.0, 0.0, 0.5, 0.0]                            # the timeout counts 0
    assert np.allclose(t["advantages"], [[S, 0, S], [-S, 0, 0], [S, S, 0], [0, 0, 0]], atol=1e-5)
    assert np.allclose(t["token_level_scores"], [[0, 0, 1], [0, 0, 0], [0, 0.5, 0], [0, 0, 0]])
    assert batch.stats.failed_samples == 1 and batch.stats.groups == 2 and batch.stats.mean_reward == pytest.approx(0.375)


def test_verl_key_names_and_torch_tensors() -> None:
    tensors = GroupBatcher().build(groups()).tensors()
    for key in ("prompts", "responses", "response_mask", "attention_mask", "position_ids", "rollout_log_probs",
                "token_level_scores", "input_ids", "old_logprobs", "advantages", "rewards"):
        assert key in tensors, key
    # The sampler's logprobs are verl's `rollout_log_probs`. `old_log_probs` is the one verl recomputes
    # and merges with DataProto.union, which asserts equal values on a shared key: never ours.
    assert "old_log_probs" not in tensors and "old_log_probs" not in GroupBatcher().build(groups()).numpy()
    assert tensors["rollout_log_probs"] is tensors["old_logprobs"]
    assert str(tensors["input_ids"].dtype) == "torch.int64" and str(tensors["advantages"].dtype) == "torch.float32"


def test_dr_grpo_and_the_failed_sample_policies() -> None:
    dr = GroupBatcher(advantage="drgrpo").build(groups()).numpy()["advantages"]
    assert np.allclose(dr[:, 0], [0.5, -0.5, 0.25, 0.0])                            # r - mean, no std
    dropped = GroupBatcher(failed="drop_group").build(groups())
    assert dropped.job_ids == ["a", "b"] and dropped.stats.dropped_groups == 1 and dropped.stats.dropped_samples == 2
    alone = GroupBatcher(failed="drop_sample").build(groups())
    assert alone.job_ids == ["a", "b", "c"] and alone.stats.dropped_samples == 1
    assert np.allclose(alone.numpy()["advantages"][2, :2], [0.5, 0.5])               # a group of one: mean 0, std 1
    with pytest.raises(ValueError, match="drop_group"):
        GroupBatcher(failed="skip")
