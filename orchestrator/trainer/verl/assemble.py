"""Shard rows -> verl's rollout batch layout, as numpy arrays (no verl, no torch: see manager.py).

One output row per input row of verl's batch, in its order (RayPPOTrainer unions the result with
`batch.repeat(n)`, which asserts the same size and keys with equal values):

    prompts         [B, prompt_length]     left-padded                  the row's prompt_ids
    responses       [B, response_length]   right-padded, cut at length  sampled + observation tokens
    response_mask   [B, response_length]   1 = sampled; 0 = tool/observation token or pad
    input_ids       [B, P + R]             prompts ++ responses
    attention_mask  [B, P + R]             1 on real tokens
    position_ids    [B, P + R]             cumsum(attention) - 1, 0 on left pad (verl's rule)
    rollout_log_probs [B, R]               the sampler's logprobs (0 where the mask is 0)
    rm_scores       [B, R]                 the reward on the last response token (+ DAPO's overlong
                                           penalty when verl's config asks for it: verl_config.py)
    uid, __num_turns__, hpc_rollout_* and reward extras: non-tensors

A sample whose job did not end `ok` (failed, timeout, cancelled at the time limit, no reward) or
whose row never came is MASKED, not dropped: its prompt stays, its response is empty (response
mask and response attention all 0), its reward 0. It adds no loss token, and in its GRPO group it
counts as a wrong answer (like GroupBatcher's failed="zero"); dropping it would change the batch
size, and verl's own union of the result with its repeated batch asserts on that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from orchestrator.trainer import verl_keys as keys
from orchestrator.trainer.verl.verl_config import Overlong

Row = Mapping[str, Any]
STATUS = "hpc_rollout_status"      # ok | failed | timeout | cancelled | missing
JOB_ID = "hpc_rollout_job_id"
POLICY_VERSION = "hpc_rollout_policy_version"   # the oldest policy a sample's turns used (-1: none)


@dataclass
class AssemblyCounts:
    samples: int = 0
    ok: int = 0
    masked: int = 0                 # every sample below is masked
    failed: int = 0
    timeout: int = 0
    cancelled: int = 0
    missing: int = 0                # no row by the time the batch was returned
    no_reward: int = 0              # status ok but no reward
    prompt_too_long: int = 0        # prompt longer than prompt_length (and otherwise usable): masked, cut from the left
    truncated_responses: int = 0    # responses longer than response_length, cut (as verl's agent loops do)

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Assembled:
    tensors: dict[str, np.ndarray]
    non_tensors: dict[str, np.ndarray]
    reward_extra_keys: list[str]
    counts: AssemblyCounts = field(default_factory=AssemblyCounts)


def assemble(
    slots: Sequence[Row | None],
    uids: Sequence[Any],
    fallback_prompts: Sequence[Sequence[int]],
    prompt_length: int,
    response_length: int,
    pad_id: int = 0,
    overlong: Overlong | None = None,
) -> Assembled:
    """The batch of `slots` (the row of each verl sample, None when none came).

    `fallback_prompts[i]`: the prompt ids of sample i when its row has none (a job cancelled
    before it rendered its prompt); the manager takes them from a sibling or the tokenizer.
    The rows are read once in Python; the padded arrays are filled by whole-batch numpy
    operations (a boolean mask per layout, the concatenated tokens): ~5x a slice per row.
    """
    n, width_p, width_r = len(slots), prompt_length, response_length
    counts = AssemblyCounts(samples=n)
    parts = _Parts.empty(n)
    for i, row in enumerate(slots):
        parts.read(i, row, fallback_prompts[i], width_p, width_r, counts)
    padded = _Padded.of(parts, width_p, width_r, pad_id)
    if overlong is not None:
        _apply_overlong(overlong, parts.rewards, parts.response_lengths, parts.usable, parts.extras)
    rm_scores = np.zeros((n, width_r), dtype=np.float32)
    scored = parts.usable & (parts.response_lengths > 0)
    rm_scores[np.flatnonzero(scored), parts.response_lengths[scored] - 1] = parts.rewards[scored]
    extra_keys = sorted({key for extra in parts.extras for key in extra})
    non_tensors = {
        keys.UID: np.asarray(list(uids), dtype=object),
        keys.NUM_TURNS: _turns(parts.mask_parts, parts.usable, parts.response_lengths),
        STATUS: parts.statuses,
        JOB_ID: parts.job_ids,
        POLICY_VERSION: parts.versions,
        **{key: _object_array([extra.get(key) for extra in parts.extras]) for key in extra_keys},
    }
    tensors = {
        keys.PROMPTS: padded.prompts, keys.RESPONSES: padded.responses, keys.RESPONSE_MASK: padded.response_mask,
        keys.INPUT_IDS: np.concatenate([padded.prompts, padded.responses], axis=1),
        keys.ATTENTION_MASK: np.concatenate([padded.in_prompt, padded.in_response], axis=1).astype(np.int64),
        keys.POSITION_IDS: _position_ids(parts.prompt_lengths, parts.response_lengths, width_p, width_r),
        keys.ROLLOUT_LOG_PROBS: padded.logprobs, keys.RM_SCORES: rm_scores,
    }
    return Assembled(tensors, non_tensors, extra_keys, counts)


@dataclass
class _Parts:
    """What the rows say, read once: per sample its status, job, version, reward and whether it is
    trained on; the token pieces of every sample, to be joined and padded in one go."""

    statuses: np.ndarray
    job_ids: np.ndarray
    versions: np.ndarray
    rewards: np.ndarray
    usable: np.ndarray
    prompt_lengths: np.ndarray
    response_lengths: np.ndarray
    prompt_parts: list[np.ndarray] = field(default_factory=list)
    response_parts: list[np.ndarray] = field(default_factory=list)
    mask_parts: list[np.ndarray] = field(default_factory=list)
    logprob_parts: list[np.ndarray] = field(default_factory=list)
    extras: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def empty(cls, n: int) -> "_Parts":
        return cls(np.empty(n, dtype=object), np.empty(n, dtype=object), np.full(n, -1, dtype=np.int64),
                   np.zeros(n, dtype=np.float32), np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64),
                   np.zeros(n, dtype=np.int64))

    def read(self, i: int, row: Row | None, fallback_prompt: Sequence[int], width_p: int, width_r: int,
             counts: AssemblyCounts) -> None:
        """Sample i: its prompt always; its response, mask and log-probs only when it is trained on."""
        status = "missing" if row is None else str(row.get("status"))
        self.statuses[i] = status
        self.job_ids[i] = None if row is None else row.get("job_id")
        reward = None if row is None else row.get("reward")
        usable = status == "ok" and reward is not None and not (isinstance(reward, float) and np.isnan(reward))
        prompt = _array(row.get("prompt_ids")) if row is not None else None
        if prompt is None or not len(prompt):
            prompt = np.asarray(fallback_prompt, dtype=np.int64)
        too_long = len(prompt) > width_p
        if too_long:
            prompt = prompt[-width_p:]
        self.prompt_parts.append(prompt)
        self.prompt_lengths[i] = len(prompt)
        if too_long and usable:        # each masked sample counts under one reason: this one only when it is the reason
            counts.prompt_too_long += 1
            counts.masked += 1
            self.extras.append({})
            return
        self.extras.append(_reward_extras(row) if usable else {})
        if not usable:
            _count_masked(counts, status, row)
            return
        assert row is not None
        counts.ok += 1
        self.usable[i] = True
        self.rewards[i] = float(reward)  # type: ignore[arg-type]
        response = _array(row.get("response_ids"))
        if response is None:   # a handler without an LLM (e.g. `sleep`): a reward and no tokens
            response = np.zeros(0, dtype=np.int64)
        length = min(len(response), width_r)
        if len(response) > width_r:
            counts.truncated_responses += 1
        self.response_lengths[i] = length
        self.response_parts.append(response[:length])
        mask = _array(row.get("response_mask"))
        self.mask_parts.append(mask[:length] if mask is not None and len(mask) >= length else np.ones(length, dtype=np.int8))
        sampled = row.get("logprobs")
        self.logprob_parts.append(np.asarray(sampled)[:length] if sampled is not None and len(sampled) >= length
                                  else np.zeros(length, dtype=np.float32))
        version = row.get("policy_version_min")
        self.versions[i] = -1 if version is None else int(version)


@dataclass(frozen=True)
class _Padded:
    """The token pieces joined into the padded [B, width] arrays, and where the real tokens are."""

    in_prompt: np.ndarray
    in_response: np.ndarray
    prompts: np.ndarray
    responses: np.ndarray
    response_mask: np.ndarray
    logprobs: np.ndarray

    @classmethod
    def of(cls, parts: _Parts, width_p: int, width_r: int, pad_id: int) -> "_Padded":
        n = len(parts.statuses)
        # Boolean masks fill in row-major order: row by row, columns ascending, as the parts were joined.
        in_prompt = np.arange(width_p)[None, :] >= (width_p - parts.prompt_lengths)[:, None]
        in_response = np.arange(width_r)[None, :] < parts.response_lengths[:, None]
        prompts = np.full((n, width_p), pad_id, dtype=np.int64)
        prompts[in_prompt] = _joined(parts.prompt_parts, np.int64)
        responses = np.full((n, width_r), pad_id, dtype=np.int64)
        responses[in_response] = _joined(parts.response_parts, np.int64)
        response_mask = np.zeros((n, width_r), dtype=np.int64)
        response_mask[in_response] = _joined(parts.mask_parts, np.int64)
        logprobs = np.zeros((n, width_r), dtype=np.float32)
        logprobs[in_response] = _joined(parts.logprob_parts, np.float32)
        logprobs *= response_mask                          # 0 where the mask is 0, as verl's agent loops give them
        return cls(in_prompt, in_response, prompts, responses, response_mask, logprobs)


def _position_ids(prompt_lengths: np.ndarray, response_lengths: np.ndarray, width_p: int, width_r: int) -> np.ndarray:
    """verl's cumsum(attention) - 1 rule, in closed form: 0 on the left pad, then 0, 1, ..., and
    the last position repeated on the right pad."""
    start = width_p - prompt_lengths
    last = np.maximum(prompt_lengths + response_lengths - 1, 0)
    return np.clip(np.arange(width_p + width_r)[None, :] - start[:, None], 0, last[:, None])


def _apply_overlong(overlong: Overlong, rewards: np.ndarray, lengths: np.ndarray, usable: np.ndarray,
                    extras: list[dict[str, Any]]) -> None:
    """verl's DAPO overlong penalty on the usable samples, in place. Its length is the response's
    attended tokens (sampled and observation), what `attention_mask[-response_length:].sum()` counts."""
    penalties = overlong.penalties(lengths)
    rewards[usable] += penalties[usable]
    if overlong.log:                      # verl's reward extras when overlong_buffer_cfg.log is set
        for i in np.flatnonzero(usable):
            extras[i].update(overlong_reward=float(penalties[i]), overlong=bool(penalties[i] < 0))


def _turns(mask_parts: list[np.ndarray], usable: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The prompt, then each run of sampled or observation tokens (a masked sample: 1), counted
    on the joined masks: a change of value inside a response starts a run."""
    turns = np.ones(len(usable), dtype=np.int32)
    if not mask_parts:
        return turns
    flat = np.concatenate(mask_parts)
    changes = np.zeros(len(flat), dtype=np.int32)
    changes[1:] = flat[1:] != flat[:-1]
    ends = np.cumsum(lengths[usable])
    starts = ends - lengths[usable]
    changes[starts[starts < len(flat)]] = 0            # a response's first token starts its first run
    running = np.concatenate([[0], np.cumsum(changes)])
    turns[usable] = 2 + (running[ends] - running[starts])
    return turns


def _joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def _count_masked(counts: AssemblyCounts, status: str, row: Row | None) -> None:
    counts.masked += 1
    if status in ("failed", "timeout", "cancelled", "missing"):
        setattr(counts, status, getattr(counts, status) + 1)
    elif row is not None and status == "ok":
        counts.no_reward += 1


def _array(value: Any) -> np.ndarray | None:
    """A token column as it is (the reader's numpy views: no copy, no cast per row)."""
    return None if value is None else np.asarray(value)


def _reward_extras(row: Row | None) -> dict[str, Any]:
    """What a verl reward function returned beyond `score` (the row's result JSON, `reward_extra_info`)."""
    text = None if row is None else row.get("result")
    if not text:
        return {}
    try:
        extra = orjson.loads(text).get("reward_extra_info")
    except (orjson.JSONDecodeError, AttributeError):
        return {}
    return dict(extra) if isinstance(extra, dict) else {}


def _object_array(values: list[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array
