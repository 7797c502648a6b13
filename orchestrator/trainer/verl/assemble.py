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
    rm_scores       [B, R]                 the reward on the last response token
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
    prompt_too_long: int = 0        # prompt longer than prompt_length: masked, prompt cut from the left
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
) -> Assembled:
    """The batch of `slots` (the row of each verl sample, None when none came).

    `fallback_prompts[i]`: the prompt ids of sample i when its row has none (a job cancelled
    before it rendered its prompt); the manager takes them from a sibling or the tokenizer.
    """
    n, width_p, width_r = len(slots), prompt_length, response_length
    prompts = np.full((n, width_p), pad_id, dtype=np.int64)
    responses = np.full((n, width_r), pad_id, dtype=np.int64)
    attention = np.zeros((n, width_p + width_r), dtype=np.int64)
    response_mask = np.zeros((n, width_r), dtype=np.int64)
    logprobs = np.zeros((n, width_r), dtype=np.float32)
    rm_scores = np.zeros((n, width_r), dtype=np.float32)
    statuses = np.empty(n, dtype=object)
    job_ids = np.empty(n, dtype=object)
    versions = np.full(n, -1, dtype=np.int64)
    turns = np.zeros(n, dtype=np.int32)
    counts = AssemblyCounts(samples=n)
    extras: list[dict[str, Any]] = []
    for i, row in enumerate(slots):
        status = "missing" if row is None else str(row.get("status"))
        statuses[i] = status
        job_ids[i] = None if row is None else row.get("job_id")
        reward = None if row is None else row.get("reward")
        usable = status == "ok" and reward is not None and not (isinstance(reward, float) and np.isnan(reward))
        prompt = _ints(row.get("prompt_ids")) if row is not None else None
        if prompt is None or not len(prompt):
            prompt = np.asarray(fallback_prompts[i], dtype=np.int64)
        if len(prompt) > width_p:
            counts.prompt_too_long += 1
            usable = False
            prompt = prompt[-width_p:]
        prompts[i, width_p - len(prompt):] = prompt
        attention[i, width_p - len(prompt):width_p] = 1
        extras.append(_reward_extras(row) if usable else {})
        if not usable:
            _count_masked(counts, status, row)
            turns[i] = 1
            continue
        counts.ok += 1
        response = _ints(row.get("response_ids"))
        if response is None:   # a handler without an LLM (e.g. `sleep`): a reward and no tokens
            response = np.zeros(0, dtype=np.int64)
        length = min(len(response), width_r)
        if len(response) > width_r:
            counts.truncated_responses += 1
        responses[i, :length] = response[:length]
        attention[i, width_p:width_p + length] = 1
        mask = _ints(row.get("response_mask"))
        response_mask[i, :length] = mask[:length] if mask is not None and len(mask) >= length else 1
        sampled = row.get("logprobs")
        if sampled is not None and len(sampled) >= length:
            logprobs[i, :length] = np.asarray(sampled[:length], dtype=np.float32) * response_mask[i, :length]
        if length:
            rm_scores[i, length - 1] = float(reward)  # type: ignore[arg-type]
        version = row.get("policy_version_min")
        versions[i] = -1 if version is None else int(version)
        turns[i] = 1 + _segments(response_mask[i, :length])
    input_ids = np.concatenate([prompts, responses], axis=1)
    position_ids = np.clip(np.cumsum(attention, axis=1) - 1, 0, None)
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


def _count_masked(counts: AssemblyCounts, status: str, row: Row | None) -> None:
    counts.masked += 1
    if status in ("failed", "timeout", "cancelled", "missing"):
        setattr(counts, status, getattr(counts, status) + 1)
    elif row is not None and status == "ok":
        counts.no_reward += 1


def _ints(value: Any) -> np.ndarray | None:
    return None if value is None else np.asarray(value, dtype=np.int64)


def _segments(mask: np.ndarray) -> int:
    """Turns in a response: runs of sampled tokens and runs of observation tokens between them."""
    if not len(mask):
        return 1
    return int(np.count_nonzero(np.diff(mask)) + 1)


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
