"""Per-turn facts of rows onto tokens: turn rewards, policy versions, stale turns masked.

A row's `turn_spans` say where each turn's sampled tokens sit in `response_ids` and which policy
version sampled them; `turn_rewards` hold a reward per turn (orchestrator/spool/turn_columns.py).

    place_turn_rewards(scores, rows, cap)   each turn's reward on its last token (verl's token-level
                                            scores layout), a sample's total capped at `cap`
    token_versions(rows, width)             N x R: the policy version of each sampled token, -1 elsewhere
    mask_stale_turns(row, min_version)      a `continue` row with the tokens of turns older than
                                            min_version out of the loss mask (they stay as context)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Row = dict[str, Any]


def _spans(row: Row) -> list[dict[str, Any] | None]:
    spans = row.get("turn_spans")
    return list(spans) if spans is not None else []


def place_turn_rewards(scores: np.ndarray, rows: Sequence[Row], cap: float | None = None) -> int:
    """Add each row's turn rewards to its line of `scores` (N x R), on the last token of the turn.

    With `cap`, the rewards of one row are scaled down together so that the sum of their absolute
    values is at most `cap`: more turns cannot earn more process reward than that. Returns how
    many rewards had no place (the turn is not in the row's sequence, or past the batch's width).
    """
    unplaced = 0
    for line, row in enumerate(rows):
        rewards = row.get("turn_rewards")
        if rewards is None:
            continue
        spans = _spans(row)
        placed: list[tuple[int, float]] = []
        for index, reward in enumerate(rewards):
            if reward is None or reward != reward:   # null (NaN once read as a numpy view: trainer/tail.py)
                continue
            span = spans[index] if index < len(spans) else None
            if span is None or span["end"] <= span["start"] or span["end"] > scores.shape[1]:
                unplaced += 1
                continue
            placed.append((span["end"] - 1, float(reward)))
        total = sum(abs(reward) for _, reward in placed)
        scale = cap / total if cap is not None and total > cap else 1.0
        for position, reward in placed:
            scores[line, position] += reward * scale
    return unplaced


def token_versions(rows: Sequence[Row], width: int) -> np.ndarray:
    """N x width: the policy version that sampled each response token; -1 for observation tokens,
    padding, and rows without turn spans."""
    versions = np.full((len(rows), width), -1, dtype=np.int64)
    for line, row in enumerate(rows):
        for span in _spans(row):
            if span is not None and span.get("policy_version") is not None:
                versions[line, span["start"]:min(span["end"], width)] = int(span["policy_version"])
    return versions


def mask_stale_turns(row: Row, min_version: int) -> tuple[Row, int] | None:
    """`row` with the sampled tokens of its turns older than `min_version` given mask 0, and how many
    tokens that masked; None when the row has no turn spans to tell its turns apart by."""
    spans = _spans(row)
    if not spans or row.get("response_mask") is None:
        return None
    mask = np.array(row["response_mask"], dtype=np.int8, copy=True)
    masked = 0
    for span in spans:
        if span is None or span.get("policy_version") is None or int(span["policy_version"]) >= min_version:
            continue
        stretch = mask[span["start"]:span["end"]]
        masked += int(stretch.sum())
        stretch[:] = 0
    if not masked:
        return row, 0
    return {**row, "response_mask": mask}, masked
