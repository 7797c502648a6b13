"""What became of a verl batch's samples, put where verl logs it; a batch with nothing usable refused.

verl 0.9.1 logs a rollout manager's output in two places only (trainer/ppo/ray_trainer.py):
- training steps: `timing_raw.update(output.meta_info["timing"])`, and `compute_timing_metrics`
  logs every key of it as `timing_s/<key>`: the shares below arrive as `timing_s/hpc_rollout/failed_share`;
- validation (`_validate`): only `rm_scores` and the non-tensors named by `meta_info["reward_extra_keys"]`,
  per data source as `val-aux/<data_source>/<key>/mean@N`: validation batches carry per-sample
  flags (`hpc_rollout_failed`, ...) there.
`meta_info["hpc_rollout"]` is never logged by verl (scripts may read it).

A batch whose samples all failed (or all lack a reward, or all have prompts too long) raises
AllSamplesFailed naming the first failure: masked, it would train on nothing and show only a
reward of 0. A batch cut entirely by the time limit is counted, not raised: a slow step is not
a broken one (the time limit's own log line says what was cancelled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.errors import HpcRolloutError
from orchestrator.trainer import verl_keys as keys
from orchestrator.trainer.verl.assemble import STATUS, Assembled

SHARES = ("failed", "timed_out", "cancelled", "no_reward", "prompt_too_long", "masked")
# per-sample flags of validation batches (reward extras), by the statuses they count
SAMPLE_FLAGS = {"hpc_rollout_failed": ("failed",), "hpc_rollout_timed_out": ("timeout",),
                "hpc_rollout_cancelled": ("cancelled", "missing")}
MAX_REASON = 400


class AllSamplesFailed(HpcRolloutError, RuntimeError):
    """No sample of a verl batch is usable and at least one failed; the message names the first failure."""


@dataclass(frozen=True)
class Outcomes:
    samples: int
    ok: int
    failed: int
    timed_out: int
    cancelled: int          # cancelled at the time limit, or no row by the end of its grace
    no_reward: int
    prompt_too_long: int
    first_failure: str | None      # "job ID (handler 'H', data_source 'D'): reason", one line
    first_job: str | None
    run: str

    @property
    def masked(self) -> int:
        return self.samples - self.ok

    def metrics(self) -> dict[str, float]:
        """`hpc_rollout/<kind>_share` for meta_info["timing"] (verl logs it as timing_s/hpc_rollout/...)."""
        total = max(self.samples, 1)
        return {f"hpc_rollout/{kind}_share": getattr(self, kind) / total for kind in SHARES}

    def summary(self) -> str:
        parts = [f"{self.masked} of {self.samples} samples masked ({self._breakdown()})"]
        if self.first_failure:
            parts.append(f"first failure: {self.first_failure}")
        return "; ".join(parts)

    def check(self) -> None:
        """AllSamplesFailed when nothing is usable and something failed (not when all were cut by the time limit)."""
        if self.ok or not (self.failed or self.timed_out or self.no_reward or self.prompt_too_long):
            return
        where = f"; every job's reason: hpc-rollout inspect {self.run} {self.first_job}" if self.first_job else ""
        raise AllSamplesFailed(f"all {self.samples} samples of this batch failed ({self._breakdown()}): "
                               f"first, {self.first_failure}{where}")

    def _breakdown(self) -> str:
        words = (("failed", "failed"), ("timed_out", "timed out"), ("cancelled", "cancelled"),
                 ("no_reward", "without a reward"), ("prompt_too_long", "with a prompt too long"))
        return ", ".join(f"{getattr(self, kind)} {word}" for kind, word in words if getattr(self, kind))


def outcomes_of(assembled: Assembled, slots: Sequence[Mapping[str, Any] | None], run: str | Path) -> Outcomes:
    counts = assembled.counts
    first, job = _first_failure(assembled, slots)
    return Outcomes(samples=counts.samples, ok=counts.ok, failed=counts.failed, timed_out=counts.timeout,
                    cancelled=counts.cancelled + counts.missing, no_reward=counts.no_reward,
                    prompt_too_long=counts.prompt_too_long, first_failure=first, first_job=job, run=str(run))


def flag_samples(assembled: Assembled) -> None:
    """Add the per-sample flags to a validation batch's reward extras (1.0 where the status counts)."""
    statuses = assembled.non_tensors[STATUS]
    for key, counted in SAMPLE_FLAGS.items():
        flags = np.empty(len(statuses), dtype=object)   # object: verl's reward extras are object arrays
        flags[:] = [1.0 if status in counted else 0.0 for status in statuses]
        assembled.non_tensors[key] = flags
    assembled.reward_extra_keys = sorted({*assembled.reward_extra_keys, *SAMPLE_FLAGS})


def _first_failure(assembled: Assembled, slots: Sequence[Mapping[str, Any] | None]) -> tuple[str | None, str | None]:
    """The first failed or timed-out sample in verl's row order; else the first ok one left unusable."""
    statuses = assembled.non_tensors[STATUS]
    prompt_length = int(assembled.tensors[keys.PROMPTS].shape[1])
    for wanted in (("failed", "timeout"), ("ok",)):
        for status, row in zip(statuses, slots):
            if status not in wanted or row is None:
                continue
            if status == "ok":
                reason = _unusable_ok(row, prompt_length)
                if reason is None:
                    continue
            else:
                reason = _one_line(str(row.get("error") or f"ended {status} with no error recorded"))
            job = str(row.get("job_id"))
            return (f"job {job} (handler {row.get('handler')!r}, data_source {row.get('data_source')!r}): "
                    f"{reason}"), job
    return None, None


def _unusable_ok(row: Mapping[str, Any], prompt_length: int) -> str | None:
    reward = row.get("reward")
    if reward is None or (isinstance(reward, float) and np.isnan(reward)):
        return "ended ok with no reward: the handler's EVAL returned none"
    prompt = row.get("prompt_ids")
    if prompt is not None and len(prompt) > prompt_length:
        return (f"prompt longer than actor_rollout_ref.rollout.prompt_length ({prompt_length}): "
                "raise it (and data.max_prompt_length)")
    return None


def _one_line(text: str) -> str:
    line = " / ".join(part.strip() for part in text.splitlines() if part.strip())
    return line if len(line) <= MAX_REASON else line[:MAX_REASON - 3] + "..."
