"""The staleness bound: samples of a policy older than current - max_policy_lag are not trained on.

What counts is what the trainer will see, and a job's `staleness` (orchestrator.config.Staleness,
fixed at submission) says how:
  * restart (the default): the oldest token's version. A job that already sampled with a policy
    older than the registry's `min_policy_version` can only produce a stale row, so it is
    cancelled, not finished: before each LLM turn (orchestrator/llm/session.py) and before EVAL
    (the worker) it is checked, and it ends `cancelled` with error kind `stale_policy`. Jobs that
    have not sampled yet are left alone: they will sample with the new weights. The sampler
    submits the prompt again as a fresh group (a re-queue at the new version); its tokens are lost.
  * continue (a partial rollout): per-turn versions. The job keeps its finished turns and goes on
    with the new weights (the next turn re-prefills the whole conversation on them); every turn
    records the version that produced it. The trainer masks out of the loss the sampled tokens of
    turns older than the bound (they stay in the sequence as context, like observations:
    orchestrator/trainer/turn_tokens.py) and trains on the rest. Only a job whose newest turn is
    too old (nothing left to train on) is stale; it is cancelled before EVAL like a restart job.
Where it acts: the registry (backends.json) holds `min_policy_version` = version - lag, written
when the trainer swaps weights (orchestrator/llm/weights.py); the sampler drops stale rows and
counts them (orchestrator/trainer/sampler.py). Rows without a policy version (handlers that call
no LLM) are never stale.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config import Staleness
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


def job_stale_reason(staleness: Staleness | str, oldest_version: int | None, newest_version: int | None,
                     min_version: int) -> str | None:
    """Why a job with no turns left to sample (before EVAL) can only produce a stale row.

    restart judges its oldest token; continue its newest turn (older turns are masked, not dropped).
    """
    mode = Staleness.parse(staleness)
    return stale_reason(newest_version if mode is Staleness.CONTINUE else oldest_version, min_version)


def staleness_floor(version: int, max_policy_lag: int | None) -> int | None:
    """The oldest policy version still trained on at `version`: version - lag (never below 0);
    None when there is no bound (lag None or negative). The one place the rule is written."""
    if max_policy_lag is None or max_policy_lag < 0:
        return None
    return max(0, version - max_policy_lag)


def row_is_stale(row: dict[str, Any], current_version: int, max_policy_lag: int) -> bool:
    """Whether a row holds nothing the trainer may use at `current_version` with this lag.

    restart rows: produced (in part) by a policy older than current - lag. continue rows: even
    their newest turn is that old (their older turns are masked: trainer/turn_tokens.py).
    """
    if (row.get("error") or "").startswith(STALE_KIND):
        return True
    key = "policy_version_max" if row.get("staleness") == Staleness.CONTINUE.value else "policy_version_min"
    version, floor = row.get(key), staleness_floor(current_version, max_policy_lag)
    return floor is not None and version is not None and int(version) < floor
