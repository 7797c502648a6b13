"""Whether a handler's token columns agree: what a trainer needs to take a row's tokens as they are.

`response_mask` and `logprobs` hold one entry per `response_ids` token; the mask is 1 (sampled
by the model) or 0 (a tool's output, a user turn); log-probabilities are finite and at most 0.
Every trainer zips these columns token by token (verl's batch, TRL's samples, GroupBatcher), so
a row that breaks this is not trainable: it fails at the worker, naming the column, instead of
crashing a trainer steps later or shifting log-probs against their tokens.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.errors import HpcRolloutError

# log_softmax is at most 0; a float32 rounding of 0 may land just above it.
LOGPROB_CEILING = 1e-4


# What the check covers; a row that fails it keeps them in `result.token_columns_refused`, as given.
TOKEN_COLUMNS = ("prompt_ids", "response_ids", "response_mask", "logprobs")


class TokenColumnsError(HpcRolloutError, ValueError):
    """A row's token columns disagree (the job fails with this as its error)."""


def token_columns_problem(columns: Mapping[str, Any]) -> str | None:
    """What is wrong with the token columns of a handler's result, or None when they agree."""
    for name in ("prompt_ids", "response_ids"):
        ids = _sequence(columns.get(name)) or []
        if not _all_ids(ids):
            index, value = next((i, v) for i, v in enumerate(ids) if not _all_ids([v]))
            return f"{name}[{index}] = {value!r}: a token id is an integer"
    response = _sequence(columns.get("response_ids"))
    for name in ("response_mask", "logprobs"):
        values = _sequence(columns.get(name))
        if values and len(values) != len(response or ()):   # empty: not given (readers fill it in)
            return f"{name} has {len(values)} entries for {len(response or ())} response_ids: give one per token"
    # Per row on the worker's loop: whole-list checks first (C speed), the culprit's index only then.
    mask = _sequence(columns.get("response_mask")) or []
    if not _all_flags(mask):
        index, flag = next((i, f) for i, f in enumerate(mask) if not _all_flags([f]))
        return f"response_mask[{index}] = {flag!r}: 1 for a token the model sampled, 0 for any other"
    logprobs = _sequence(columns.get("logprobs")) or []
    if logprobs and not _all_logprobs(logprobs):
        culprit = next(((i, v) for i, v in enumerate(logprobs) if not _all_logprobs([v])), None)
        if culprit is not None:   # None: each is valid, only their sum overflowed
            index, logprob = culprit
            return f"logprobs[{index}] = {logprob!r}: a log-probability is a finite number <= 0 (0.0 on masked tokens)"
    return None


def _all_ids(values: Sequence[Any]) -> bool:
    try:
        array("q", values)   # C speed; refuses floats, texts and lists
        return True
    except (TypeError, OverflowError):
        return False


def _all_flags(values: Sequence[Any]) -> bool:
    try:
        return set(values) <= {0, 1}
    except TypeError:   # an unhashable entry: not a flag
        return False


def _all_logprobs(values: Sequence[Any]) -> bool:
    """Every value a finite number <= LOGPROB_CEILING (a NaN or an infinity makes the sum non-finite)."""
    try:
        return math.isfinite(math.fsum(values)) and max(values) <= LOGPROB_CEILING
    except (TypeError, ValueError, OverflowError):   # not numbers; a sum past the float range
        return False


def _sequence(value: Any) -> Sequence[Any] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__"):
        return [value]   # not a list at all: counted as one entry, so the length check names it
    return list(value)
