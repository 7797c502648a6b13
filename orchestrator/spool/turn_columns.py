"""The per-turn columns of a row: where each LLM call's tokens sit, which policy made them, its reward.

A row's `turns` hold every request the backend received (its exact input ids, output ids, policy
version) but are bulky: a trainer reads these compact columns instead (trainer/turn_tokens.py):

    turn_spans    per turn, {start, end, policy_version}: its sampled tokens are
                  response_ids[start:end]; null for a turn whose tokens are not in the row's
                  sequence (an earlier segment of a context-managed agent, an earlier harness
                  sample: orchestrator/proxy/trajectory.py samples_of rebuilds those)
    turn_rewards  per turn, a reward the handler gave it (a process reward), or null

A turn is placed by its ids alone: it belongs to the row's sequence when its input ids are the
prompt followed by the start of the response, and its output ids come next, verbatim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from orchestrator.errors import HpcRolloutError


def turn_spans(prompt_ids: Sequence[int] | None, response_ids: Sequence[int] | None,
               turns: Sequence[dict[str, Any]] | None) -> list[dict[str, Any] | None] | None:
    """For each turn, where its output ids sit in `response_ids` (and its policy version), or None."""
    if not turns:
        return None
    prompt, response = list(prompt_ids or ()), list(response_ids or ())
    spans: list[dict[str, Any] | None] = []
    for turn in turns:
        inputs, outputs = turn.get("input_ids") or [], turn.get("output_ids") or []
        start = len(inputs) - len(prompt)
        end = start + len(outputs)
        placed = (0 <= start and end <= len(response) and list(inputs[:len(prompt)]) == prompt
                  and list(inputs[len(prompt):]) == response[:start] and list(outputs) == response[start:end])
        spans.append({"start": start, "end": end, "policy_version": turn.get("policy_version")} if placed else None)
    return spans


class TurnRewardsError(HpcRolloutError, ValueError):
    """A handler's `turn_rewards` that cannot be stored: the message says what is wrong."""


def checked_turn_rewards(value: Any, turns: int) -> list[float | None] | None:
    """A handler's `turn_rewards` (one finite number or None per turn), or TurnRewardsError."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise TurnRewardsError(f"turn_rewards must be a list (one entry per turn), got {type(value).__name__}")
    if len(value) != turns:
        raise TurnRewardsError(f"turn_rewards has {len(value)} entries for {turns} turn(s): give one per turn "
                               "(null for a turn without a reward)")
    rewards: list[float | None] = []
    for index, reward in enumerate(value):
        if reward is None:
            rewards.append(None)
        elif isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise TurnRewardsError(f"turn_rewards[{index}] = {reward!r} is not a finite number")
        else:
            rewards.append(float(reward))
    return rewards
