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

from orchestrator.trainer.verl import keys
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
    statuses = np.empty(n, dtype=object)
    job_ids = np.empty(n, dtype=object)
    versions = np.full(n, -1, dtype=np.int64)
    rewards = np.zeros(n, dtype=np.float32)
    usable_rows = np.zeros(n, dtype=bool)
    prompt_parts: list[np.ndarray] = []
    response_parts: list[np.ndarray] = []
    mask_parts: list[np.ndarray] = []
    logprob_parts: list[np.ndarray] = []
    prompt_lengths = np.zeros(n, dtype=np.int64)
    response_lengths = np.zeros(n, dtype=np.int64)
    extras: list[dict[str, Any]] = []
    for i, row in enumerate(slots):
        status = "missing" if row is None else str(row.get("status"))
        statuses[i] = status
        job_ids[i] = None if row is None else row.get("job_id")
        reward = None if row is None else row.get("reward")
        usable = status == "ok" and reward is not None and not (isinstance(reward, float) and np.isnan(reward))
        prompt = _array(row.get("prompt_ids")) if row is not None else None
        if prompt is None or not len(prompt):
            prompt = np.asarray(fallback_prompts[i], dtype=np.int64)
        too_long = len(prompt) > width_p
        if too_long:
            prompt = prompt[-width_p:]
        prompt_parts.append(prompt)
        prompt_lengths[i] = len(prompt)
        if too_long and usable:        # each masked sample counts under one reason: this one only when it is the reason
            counts.prompt_too_long += 1
            counts.masked += 1
            usable = False
            extras.append({})
            continue
        extras.append(_reward_extras(row) if usable else {})
        if not usable:
            _count_masked(counts, status, row)
            continue
        assert row is not None
        counts.ok += 1
        usable_rows[i] = True
        rewards[i] = float(reward)  # type: ignore[arg-type]
        response = _array(row.get("response_ids"))
        if response is None:   # a handler without an LLM (e.g. `sleep`): a reward and no tokens
            response = np.zeros(0, dtype=np.int64)
        length = min(len(response), width_r)
        if len(response) > width_r:
            counts.truncated_responses += 1
        response_lengths[i] = length
        response_parts.append(response[:length])
        mask = _array(row.get("response_mask"))
        mask = mask[:length] if mask is not None and len(mask) >= length else np.ones(length, dtype=np.int8)
        mask_parts.append(mask)
        sampled = row.get("logprobs")
        logprob_parts.append(np.asarray(sampled)[:length] if sampled is not None and len(sampled) >= length
                             else np.zeros(length, dtype=np.float32))
        version = row.get("policy_version_min")
        versions[i] = -1 if version is None else int(version)
    # Boolean masks fill in row-major order: row by row, columns ascending, as the parts were joined.
    in_prompt = np.arange(width_p)[None, :] >= (width_p - prompt_lengths)[:, None]
    in_response = np.arange(width_r)[None, :] < response_lengths[:, None]
    prompts = np.full((n, width_p), pad_id, dtype=np.int64)
    prompts[in_prompt] = _joined(prompt_parts, np.int64)
    responses = np.full((n, width_r), pad_id, dtype=np.int64)
    responses[in_response] = _joined(response_parts, np.int64)
    response_mask = np.zeros((n, width_r), dtype=np.int64)
    response_mask[in_response] = _joined(mask_parts, np.int64)
    logprobs = np.zeros((n, width_r), dtype=np.float32)
    logprobs[in_response] = _joined(logprob_parts, np.float32)
    logprobs *= response_mask                          # 0 where the mask is 0, as verl's agent loops give them
    if overlong is not None:
        _apply_overlong(overlong, rewards, response_lengths, usable_rows, extras)
    rm_scores = np.zeros((n, width_r), dtype=np.float32)
    scored = usable_rows & (response_lengths > 0)
    rm_scores[np.flatnonzero(scored), response_lengths[scored] - 1] = rewards[scored]
    attention = np.concatenate([in_prompt, in_response], axis=1).astype(np.int64)
    input_ids = np.concatenate([prompts, responses], axis=1)
    # verl's cumsum(attention) - 1 rule, in closed form: 0 on the left pad, then 0, 1, ..., and
    # the last position repeated on the right pad.
    start = width_p - prompt_lengths
    last = np.maximum(prompt_lengths + response_lengths - 1, 0)
    position_ids = np.clip(np.arange(width_p + width_r)[None, :] - start[:, None], 0, last[:, None])
    turns = _turns(mask_parts, usable_rows, response_lengths)
    extra_keys = sorted({key for extra in extras for key in extra})
    non_tensors = {
        keys.UID: np.asarray(list(uids), dtype=object),
        keys.NUM_TURNS: turns,
        STATUS: statuses,
        JOB_ID: job_ids,
        POLICY_VERSION: versions,
        **{key: _object_array([extra.get(key) for extra in extras]) for key in extra_keys},
    }
    tensors = {
        keys.PROMPTS: prompts, keys.RESPONSES: responses, keys.RESPONSE_MASK: response_mask,
        keys.INPUT_IDS: input_ids, keys.ATTENTION_MASK: attention, keys.POSITION_IDS: position_ids,
        keys.ROLLOUT_LOG_PROBS: logprobs, keys.RM_SCORES: rm_scores,
    }
    return Assembled(tensors, non_tensors, extra_keys, counts)


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
