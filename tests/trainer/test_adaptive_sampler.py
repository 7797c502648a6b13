"""The adaptive budget in the async DAPO sampler, on a real spool and worker: prompts without signal
get fewer groups, the batches still come, and a restarted sampler resumes with what it learnt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.trainer import AdaptiveBudget, DynamicSampler
from orchestrator.trainer.adaptive import BudgetSettingError, prompt_key
from orchestrator.trainer.api import Spool
from tests.core.util import FAST, start_worker, stop_worker

SAMPLES = 4


def prompts() -> list[dict]:
    """Four never solved, four always solved (no GRPO signal), four coins."""
    return [{"seed": f"p{i}", "reward": {"bernoulli": [0.0, 1.0, 0.5][i % 3]}} for i in range(12)]


def groups_paid(budget: AdaptiveBudget, prompt: dict) -> float:
    seen = budget.evidence.get(prompt_key(prompt))
    return 0.0 if seen is None else (seen.successes + seen.failures) / SAMPLES


def test_prompts_without_signal_get_fewer_groups_and_a_restart_keeps_the_evidence(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run", **{**FAST, "pools.run": 16, "shards.idle_flush_s": 0.05})
    tasks = prompts()
    budget = AdaptiveBudget(samples=SAMPLES, floor=0.1, half_life_versions=1000, seed=3)
    sampler = DynamicSampler(spool, tasks, handler="sleep", samples=SAMPLES, informative_groups=4, adaptive=budget)
    worker = start_worker(spool.paths)
    try:
        for step in range(8):
            batch = sampler.next_batch(policy_version=step, timeout_s=120)
            assert len(batch.groups) == 4 and len(batch.prompts) == 4
            assert all(p["reward"]["bernoulli"] == 0.5 for p in batch.prompts), "only the coins carry a signal"
        saved = json.loads(json.dumps(sampler.state()))   # what a trainer stores with its checkpoint
        sampler.close(cancel=False)                        # then dies: its groups in flight go on

        dead = [groups_paid(budget, p) for p in tasks if p["reward"]["bernoulli"] != 0.5]
        coins = [groups_paid(budget, p) for p in tasks if p["reward"]["bernoulli"] == 0.5]
        assert sampler.totals.skipped_prompts > 0
        # Uniform sampling pays a dead prompt as many groups as a coin (ratio ~1). The budget's ratio
        # depends on what was in flight before the evidence came: 0.39-0.51 over 20 runs, two at a time
        # on 2 cores (a bound of 0.5 failed CI once at 0.53); 0.7 still says "markedly fewer".
        assert sum(dead) / len(dead) < 0.7 * sum(coins) / len(coins), f"groups per prompt: dead {dead}, coins {coins}"

        resumed_budget = AdaptiveBudget(samples=SAMPLES, seed=4)
        resumed = DynamicSampler(spool, tasks, handler="sleep", samples=SAMPLES, informative_groups=4,
                                 adaptive=resumed_budget, state=saved)
        assert resumed_budget.evidence == budget.evidence
        for step in range(8, 11):
            assert len(resumed.next_batch(policy_version=step, timeout_s=120).groups) == 4
        resumed.close(cancel=True)
    finally:
        stop_worker(worker)
    assert resumed.totals.skipped_prompts > 0, "the resumed sampler does not use what it learnt"


def test_a_budget_for_another_group_size_is_refused(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run", **FAST)
    with pytest.raises(BudgetSettingError, match="AdaptiveBudget\\(samples=4\\)"):
        DynamicSampler(spool, prompts(), handler="sleep", samples=4, informative_groups=2,
                       adaptive=AdaptiveBudget(samples=8))
