"""Whether a handler's token columns agree: what a trainer needs to take a row's tokens as they are.

`response_mask` and `logprobs` hold one entry per `response_ids` token; the mask is 1 (sampled
by the model) or 0 (a tool's output, a user turn); log-probabilities are finite and at most 0.
Every trainer zips these columns token by token (verl's batch, TRL's samples, GroupBatcher), so
a row that breaks this is not trainable: it fails at the worker, naming the column, instead of
crashing a trainer steps later or shifting log-probs against their tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.errors import HpcRolloutError

# log_softmax is at most 0; a float32 rounding of 0 may land just above it.
LOGPROB_CEILING = 1e-4


class TokenColumnsError(HpcRolloutError, ValueError):
    """A row's token columns disagree (the job fails with this as its error)."""


def token_columns_problem(columns: Mapping[str, Any]) -> str | None:
    """What is wrong with the token columns of a handler's result, or None when they agree."""
    response = _sequence(columns.get("response_ids"))
    for name in ("response_mask", "logprobs"):
        values = _sequence(columns.get(name))
        if values and len(values) != len(response or ()):   # empty: not given (readers fill it in)
            return f"{name} has {len(values)} entries for {len(response or ())} response_ids: give one per token"
    for index, flag in enumerate(_sequence(columns.get("response_mask")) or ()):
        if flag not in (0, 1) or isinstance(flag, bool):
            return f"response_mask[{index}] = {flag!r}: 1 for a token the model sampled, 0 for any other"
    for index, logprob in enumerate(_sequence(columns.get("logprobs")) or ()):
        if not isinstance(logprob, (int, float)) or isinstance(logprob, bool) or not math.isfinite(logprob) \
                or logprob > LOGPROB_CEILING:
            return f"logprobs[{index}] = {logprob!r}: a log-probability is a finite number <= 0 (0.0 on masked tokens)"
    return None


def _sequence(value: Any) -> Sequence[Any] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__"):
        return [value]   # not a list at all: counted as one entry, so the length check names it
    return list(value)
