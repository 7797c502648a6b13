"""The staleness bound: samples of a policy older than current - max_policy_lag are not trained on.

Where it acts:
  * the registry (backends.json) holds `min_policy_version` = version - lag, written when the
    trainer swaps weights (orchestrator/llm/weights.py);
  * a job that already sampled with an older policy can only produce a stale row, so it is
    cancelled, not finished: before each LLM turn (orchestrator/llm/session.py) and before
    EVAL (the worker) it is checked, and it ends `cancelled` with error kind `stale_policy`.
    Jobs that have not sampled yet are left alone: they will sample with the new weights.
    The sampler submits the prompt again as a fresh group (a re-queue at the new version);
  * the trainer's reader side drops rows whose policy_version_min is too old, and counts them
    (orchestrator/trainer/sampler.py).
Rows without a policy version (handlers that call no LLM) are never stale.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import HpcRolloutError

STALE_KIND = "stale_policy"


class StalePolicy(HpcRolloutError):
    """Raised inside a job whose samples are older than the registry's min_policy_version."""


def stale_reason(oldest_version: int | None, min_version: int) -> str | None:
    """Why a job that sampled with `oldest_version` is stale now, or None when it is not."""
    if oldest_version is None or min_version <= 0 or oldest_version >= min_version:
        return None
    return (f"sampled with policy version {oldest_version}, older than the oldest still trained on "
            f"({min_version}): the row could only be stale")


def row_is_stale(row: dict[str, Any], current_version: int, max_policy_lag: int) -> bool:
    """Whether a row was produced (in part) by a policy older than current - lag."""
    if (row.get("error") or "").startswith(STALE_KIND):
        return True
    oldest = row.get("policy_version_min")
    return max_policy_lag >= 0 and oldest is not None and int(oldest) < current_version - max_policy_lag
