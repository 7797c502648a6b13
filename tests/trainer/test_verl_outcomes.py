"""Nothing silent: what became of a verl batch's samples, as verl logs it, and a batch of failures refused.

Pure parts (no verl): the shares that go into meta_info["timing"] (verl logs them as
`timing_s/hpc_rollout/...` on training steps), the per-sample flags that go into the reward extras
of validation batches (verl logs them as `val-aux/<data_source>/hpc_rollout_failed/mean@N`), and the
error a batch with no usable sample raises. tests/verl/test_silent.py runs them through verl.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from orchestrator.trainer.verl.assemble import assemble
from orchestrator.trainer.verl.outcomes import AllSamplesFailed, SAMPLE_FLAGS, flag_samples, outcomes_of

MISSING_GRADER = ("MathVerifyMissing: the math handler needs the math-verify package: pip install "
                  "'hpc-rollout[agents]' (or pip install math-verify) (math_answers.py:76 in _start)")


def row(status: str, reward: float | None = 1.0, error: str | None = None, prompt: int = 2, **extra: Any) -> dict[str, Any]:
    return {"job_id": f"s-0000001-{extra.pop('n', 0):04d}", "status": status, "reward": reward, "error": error,
            "handler": "math", "data_source": "math", "prompt_ids": np.arange(1, prompt + 1),
            "response_ids": np.array([7, 8]), "response_mask": np.array([1, 1]), **extra}


def assembled(slots: list[dict[str, Any] | None], prompt_length: int = 4) -> Any:
    return assemble(slots, [f"u{i // 2}" for i in range(len(slots))], [[1]] * len(slots), prompt_length, 4)


def test_the_shares_of_failed_timed_out_and_cancelled_samples_are_metrics_verl_logs() -> None:
    slots = [row("ok", n=0), row("failed", None, "RuntimeError: the grader broke\n  and a second line", n=1),
             row("timeout", None, "TimeoutError: run took more than 600 s", n=2), row("cancelled", None, n=3),
             None, row("ok", None, n=5), row("ok", n=6), row("failed", None, MISSING_GRADER, n=7)]
    batch = assembled(slots)
    outcome = outcomes_of(batch, slots, "/scratch/run1")
    assert outcome.metrics() == {
        "hpc_rollout/failed_share": 2 / 8, "hpc_rollout/timed_out_share": 1 / 8,
        "hpc_rollout/cancelled_share": 2 / 8,          # cancelled at the time limit, and the one whose row never came
        "hpc_rollout/no_reward_share": 1 / 8, "hpc_rollout/prompt_too_long_share": 0.0,
        "hpc_rollout/masked_share": 6 / 8}
    # the first failure in verl's row order, on one line, with where to look
    assert outcome.first_failure == ("job s-0000001-0001 (handler 'math', data_source 'math'): "
                                     "RuntimeError: the grader broke / and a second line")
    assert "6 of 8 samples masked" in outcome.summary() and "first failure: job s-0000001-0001" in outcome.summary()
    outcome.check()      # two samples are usable: the batch trains


def test_a_batch_whose_samples_all_failed_raises_one_line_with_the_reason_and_the_fix() -> None:
    slots = [row("failed", None, MISSING_GRADER, n=i) for i in range(16)]
    outcome = outcomes_of(assembled(slots), slots, "/scratch/run1")
    with pytest.raises(AllSamplesFailed) as raised:
        outcome.check()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("all 16 samples of this batch failed (16 failed): first, job s-0000001-0000 "
                              "(handler 'math', data_source 'math'): MathVerifyMissing: ")
    assert "pip install 'hpc-rollout[agents]'" in message                       # the fix, from the reason itself
    assert "hpc-rollout inspect /scratch/run1 s-0000001-0000" in message        # where every job's reason is


def test_other_batches_with_nothing_usable_name_their_cause() -> None:
    no_reward = [row("ok", None, n=i) for i in range(2)]
    with pytest.raises(AllSamplesFailed, match=r"\(2 without a reward\): first, job s-0000001-0000 .*"
                                               r"ended ok with no reward: the handler's EVAL returned none"):
        outcomes_of(assembled(no_reward), no_reward, "/r").check()
    too_long = [row("ok", 1.0, prompt=6, n=i) for i in range(2)]
    batch = assembled(too_long)
    assert (batch.counts.prompt_too_long, batch.counts.no_reward) == (2, 0)    # not counted twice
    with pytest.raises(AllSamplesFailed, match=r"prompt longer than actor_rollout_ref.rollout.prompt_length \(4\).*"
                                               r"raise it \(and data.max_prompt_length\)"):
        outcomes_of(batch, too_long, "/r").check()
    # cancelled at the time limit: masked and counted, not raised (a slow step is not a broken one)
    cut = [row("cancelled", None, n=0), None]
    outcome = outcomes_of(assembled(cut), cut, "/r")
    outcome.check()
    assert outcome.metrics()["hpc_rollout/cancelled_share"] == 1.0 and outcome.first_failure is None


def test_validation_batches_carry_per_sample_flags_as_reward_extras() -> None:
    slots = [row("ok", n=0, result='{"reward_extra_info": {"acc": 1.0}}'), row("failed", None, "X: y", n=1),
             row("timeout", None, "T: z", n=2), None]
    batch = assembled(slots)
    flag_samples(batch)
    assert set(SAMPLE_FLAGS) <= set(batch.reward_extra_keys) and "acc" in batch.reward_extra_keys
    assert batch.non_tensors["hpc_rollout_failed"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert batch.non_tensors["hpc_rollout_timed_out"].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert batch.non_tensors["hpc_rollout_cancelled"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert batch.reward_extra_keys == sorted(batch.reward_extra_keys)
