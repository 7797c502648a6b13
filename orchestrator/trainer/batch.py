"""Complete groups of rows -> padded arrays (and torch tensors) with GRPO advantages.

    batcher = GroupBatcher(pad_id=tokenizer.pad_token_id)          # GRPO, failed samples: reward 0
    batch = batcher.build(groups)                                    # groups from reader.groups()
    tensors = batch.tensors()                                        # torch, our names and verl's

Layout (verl's): prompts left-padded to the longest prompt P, responses right-padded to the
longest response R; `input_ids` = prompts ++ responses.

    input_ids [N, P+R]      attention_mask [N, P+R]   position_ids [N, P+R] (cumsum of the mask - 1)
    prompts [N, P]          responses [N, R]          response_mask [N, R] (1 = sampled token, the
    old_logprobs [N, R]     rewards [N]               loss mask: tool/observation tokens and pad are 0)
    advantages [N, R]       token_level_scores [N, R] (the reward on the last response token, and
    rollout_log_probs       = old_logprobs (verl's name   each turn's reward on its last token)
                              for the sampler's logprobs)
    token_policy_versions [N, R] (the policy version of each sampled token; -1 elsewhere)

verl's names come from orchestrator/trainer/verl_keys.py. There is no `old_log_probs`: verl
recomputes that key itself and merges it with DataProto.union, which would assert on ours.

Per-turn rewards (a row's `turn_rewards`) go into token_level_scores on the last token of their
turn (trainer/turn_tokens.py), scaled down per sample to a total of `turn_reward_cap` when given;
`advantages` and `rewards` stay the outcome's (GRPO on `reward`).

Advantages (`advantage=`): "grpo" = (r - group mean) / (group std + eps) with the unbiased std,
as verl computes it (a group of one gets mean 0, std 1); "drgrpo" = r - group mean (Dr. GRPO:
no division by the std). The scalar is spread over the sample's response_mask.

Failed samples (`failed=`): a row whose status is not "ok" (failed, timeout, cancelled) or that
has no reward.
    "zero"         (default) it stays, reward 0.0: a timeout counts as a wrong answer
    "drop_sample"  it is left out; its group's statistics use the others
    "drop_group"   its whole group is left out
Every choice is counted in `batch.stats`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.trainer.turn_tokens import place_turn_rewards, token_versions
from orchestrator.trainer import verl_keys

Row = dict[str, Any]
# verl's name -> ours, for arrays both name (the same array under two keys).
VERL_ALIASES = {verl_keys.ROLLOUT_LOG_PROBS: "old_logprobs"}


class FailedPolicy(str, enum.Enum):
    ZERO = "zero"
    DROP_SAMPLE = "drop_sample"
    DROP_GROUP = "drop_group"


class Advantage(str, enum.Enum):
    GRPO = "grpo"        # (r - mean) / (std + eps)
    DRGRPO = "drgrpo"    # r - mean


def parse_choice(kind: type[enum.Enum], value: Any, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{what} {value!r} is not valid; use one of {', '.join(m.value for m in kind)}") from None


def is_failed(row: Row) -> bool:
    reward = row.get("reward")
    return row.get("status") != "ok" or reward is None or (isinstance(reward, float) and math.isnan(reward))


def group_advantages(rewards: Sequence[float], kind: Advantage, eps: float = 1e-6) -> list[float]:
    values = np.asarray(rewards, dtype=np.float64)
    if len(values) == 1:
        mean, std = 0.0, 1.0
    else:
        mean, std = float(values.mean()), float(values.std(ddof=1))
    if kind is Advantage.DRGRPO:
        return [float(v - mean) for v in values]
    return [float((v - mean) / (std + eps)) for v in values]


@dataclass
class BatchStats:
    groups: int = 0
    samples: int = 0
    failed_samples: int = 0          # failed/timeout/cancelled/no reward, whatever the policy did
    dropped_samples: int = 0
    dropped_groups: int = 0
    mean_reward: float = float("nan")
    unplaced_turn_rewards: int = 0   # turn rewards whose turn is not in the row's sequence

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Batch:
    arrays: dict[str, np.ndarray]
    group_ids: list[str]
    job_ids: list[str]
    stats: BatchStats = field(default_factory=BatchStats)

    def __len__(self) -> int:
        return len(self.job_ids)

    def tensors(self, device: Any = None) -> dict[str, Any]:
        """torch tensors of every array, under our names and verl's (same tensor, two keys)."""
        import torch

        out = {name: torch.as_tensor(value, device=device) for name, value in self.arrays.items()}
        for verl_name, ours in VERL_ALIASES.items():
            out[verl_name] = out[ours]
        return out

    def numpy(self) -> dict[str, np.ndarray]:
        return {**self.arrays, **{v: self.arrays[o] for v, o in VERL_ALIASES.items()}}


@dataclass(frozen=True)
class GroupBatcher:
    pad_id: int = 0
    advantage: Advantage | str = Advantage.GRPO
    failed: FailedPolicy | str = FailedPolicy.ZERO
    eps: float = 1e-6
    turn_reward_cap: float | None = None   # the most |process reward| one sample may carry in all

    def __post_init__(self) -> None:
        object.__setattr__(self, "advantage", parse_choice(Advantage, self.advantage, "advantage"))
        object.__setattr__(self, "failed", parse_choice(FailedPolicy, self.failed, "failed"))
        cap = self.turn_reward_cap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf):
            raise ValueError(f"turn_reward_cap {cap!r} must be a positive number (or None: no cap)")

    def build(self, groups: Sequence[Sequence[Row]]) -> Batch:
        stats = BatchStats()
        samples: list[tuple[Row, float, float]] = []   # (row, reward, advantage)
        for group in groups:
            kept = self._kept(group, stats)
            if not kept:
                continue
            rewards = [0.0 if is_failed(r) else float(r["reward"]) for r in kept]
            advantages = group_advantages(rewards, self.advantage, self.eps)  # type: ignore[arg-type]
            samples += list(zip(kept, rewards, advantages))
            stats.groups += 1
        stats.samples = len(samples)
        if samples:
            stats.mean_reward = float(np.mean([r for _, r, _ in samples]))
        arrays = self._arrays(samples)
        stats.unplaced_turn_rewards = place_turn_rewards(arrays["token_level_scores"], [r for r, _, _ in samples],
                                                         self.turn_reward_cap)
        arrays["token_policy_versions"] = token_versions([r for r, _, _ in samples], arrays["responses"].shape[1])
        return Batch(arrays, [r.get("group_id", "") for r, _, _ in samples],
                     [r.get("job_id", "") for r, _, _ in samples], stats)

    def _kept(self, group: Sequence[Row], stats: BatchStats) -> list[Row]:
        failed = [r for r in group if is_failed(r)]
        stats.failed_samples += len(failed)
        if failed and self.failed is FailedPolicy.DROP_GROUP:
            stats.dropped_groups += 1
            stats.dropped_samples += len(group)
            return []
        if self.failed is FailedPolicy.DROP_SAMPLE:
            stats.dropped_samples += len(failed)
            return [r for r in group if not is_failed(r)]
        return list(group)

    def _arrays(self, samples: list[tuple[Row, float, float]]) -> dict[str, np.ndarray]:
        n = len(samples)
        prompts = [_ints(row.get("prompt_ids")) for row, _, _ in samples]
        responses = [_ints(row.get("response_ids")) for row, _, _ in samples]
        width_p = max((len(p) for p in prompts), default=0)
        width_r = max((len(r) for r in responses), default=0)
        arrays: dict[str, np.ndarray] = {
            "prompts": np.full((n, width_p), self.pad_id, dtype=np.int64),
            "responses": np.full((n, width_r), self.pad_id, dtype=np.int64),
            "prompt_attention": np.zeros((n, width_p), dtype=np.int64),
            "response_attention": np.zeros((n, width_r), dtype=np.int64),
            "response_mask": np.zeros((n, width_r), dtype=np.int64),
            "old_logprobs": np.zeros((n, width_r), dtype=np.float32),
            "advantages": np.zeros((n, width_r), dtype=np.float32),
            "token_level_scores": np.zeros((n, width_r), dtype=np.float32),
            "rewards": np.zeros(n, dtype=np.float32),
        }
        for i, ((row, reward, advantage), prompt, response) in enumerate(zip(samples, prompts, responses)):
            length = len(response)
            if prompt.size:
                arrays["prompts"][i, width_p - len(prompt):] = prompt
                arrays["prompt_attention"][i, width_p - len(prompt):] = 1
            arrays["responses"][i, :length] = response
            arrays["response_attention"][i, :length] = 1
            mask = _ints(row.get("response_mask"))
            arrays["response_mask"][i, :length] = mask[:length] if len(mask) >= length else 1
            logprobs = np.asarray(row.get("logprobs") if row.get("logprobs") is not None else [], dtype=np.float32)
            if len(logprobs) >= length:
                arrays["old_logprobs"][i, :length] = logprobs[:length]
            arrays["advantages"][i, :length] = advantage * arrays["response_mask"][i, :length]
            if length:
                arrays["token_level_scores"][i, length - 1] = reward
            arrays["rewards"][i] = reward
        attention = np.concatenate([arrays.pop("prompt_attention"), arrays.pop("response_attention")], axis=1)
        arrays["input_ids"] = np.concatenate([arrays["prompts"], arrays["responses"]], axis=1)
        arrays["attention_mask"] = attention
        arrays["position_ids"] = np.clip(np.cumsum(attention, axis=1) - 1, 0, None)
        return arrays


def _ints(value: Any) -> np.ndarray:
    return np.asarray(value if value is not None else [], dtype=np.int64)
