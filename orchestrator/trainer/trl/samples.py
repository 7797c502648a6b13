"""Spool rows -> the dict GRPOTrainer's rollout function returns.

Per entry: `prompt_ids`, `completion_ids` (the row's response_ids: every turn's sampled tokens and,
in multi-turn episodes, the observation tokens between them), `logprobs` (aligned with them, 0.0
on observation tokens), `env_mask` (the row's response_mask: 1 = sampled by the model, 0 = tool
output or user turn, so TRL trains only on the model's tokens), and extra fields every reward
function receives per sample: `spool_reward`, `spool_status`, `policy_version`, `job_id`.

A sample without a usable row (failed, timed out, cancelled at the time limit, or none came) still
needs an entry: it gets the prompt ids of a sibling (else the tokenizer's rendering), one EOS
token with env_mask 0 (nothing of it is trained) and `spool_reward` 0.0, as GroupBatcher's
`failed="zero"` treats it: a failure counts as a wrong answer in its group's statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Row = Mapping[str, Any]
OK = "ok"


@dataclass
class Samples:
    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    env_mask: list[list[int]] = field(default_factory=list)
    spool_reward: list[float] = field(default_factory=list)
    spool_status: list[str] = field(default_factory=list)
    policy_version: list[int] = field(default_factory=list)   # the oldest policy that sampled the entry (-1: none)
    job_id: list[str] = field(default_factory=list)

    def to_trl(self) -> dict[str, list[Any]]:
        return dict(vars(self))


def _seq(row: Row | None, column: str) -> list[Any]:
    """A list column as a list (the reader gives numpy arrays or lists; null is empty)."""
    value = row.get(column) if row is not None else None
    return [] if value is None else list(value)


def usable(row: Row | None) -> bool:
    return row is not None and row.get("status") == OK and len(_seq(row, "response_ids")) > 0


def samples_of(slots: Sequence[Row | None], group_of_slot: Sequence[int], render: Callable[[int], list[int]],
               eos_id: int) -> Samples:
    """The entries in TRL's order; `group_of_slot[i]` numbers the task of entry i, `render(i)` the
    prompt ids of entry i when no row of its group has them."""
    sibling_prompt: dict[int, list[int]] = {}
    for slot, row in enumerate(slots):
        if ids := _seq(row, "prompt_ids"):
            sibling_prompt.setdefault(group_of_slot[slot], [int(x) for x in ids])
    out = Samples()
    for slot, row in enumerate(slots):
        prompt = [int(x) for x in _seq(row, "prompt_ids")] or sibling_prompt.get(group_of_slot[slot]) or render(slot)
        out.prompt_ids.append(prompt)
        out.job_id.append(str(row.get("job_id")) if row is not None else "")
        out.spool_status.append(str(row.get("status")) if row is not None else "missing")
        version = row.get("policy_version_min") if row is not None else None
        out.policy_version.append(int(version) if version is not None else -1)
        if usable(row):
            assert row is not None
            response = [int(x) for x in _seq(row, "response_ids")]
            out.completion_ids.append(response)
            out.logprobs.append([float(x) for x in _seq(row, "logprobs")] or [0.0] * len(response))
            out.env_mask.append([int(x) for x in _seq(row, "response_mask")] or [1] * len(response))
            out.spool_reward.append(float(row["reward"]) if row.get("reward") is not None else 0.0)
        else:
            out.completion_ids.append([eos_id])
            out.logprobs.append([0.0])
            out.env_mask.append([0])
            out.spool_reward.append(0.0)
    return out
