"""The adaptive budget's judgement, in numbers: its chance of an informative group, what it admits,
how evidence fades, its saved state, and the settings it refuses."""

from __future__ import annotations

import json
import random

import pytest

from orchestrator.trainer.adaptive import (
    AdaptiveBudget, BudgetSettingError, informative_chance, prompt_key,
)

DEAD = {"question": "always wrong"}
TRIVIAL = {"question": "always right"}
MIDDLING = {"question": "a coin"}


def test_the_chance_of_an_informative_group_matches_a_known_pass_rate_and_simulation() -> None:
    for p in (0.05, 0.3, 0.5, 0.9):
        certain = informative_chance(20_000 * p, 20_000 * (1 - p), 8)   # a posterior this narrow is p itself
        assert certain == pytest.approx(1 - p**8 - (1 - p) ** 8, abs=2e-3)
    rng = random.Random(1)   # Beta(2, 5): the chance integrates over p
    draws = [rng.betavariate(2, 5) for _ in range(100_000)]
    simulated = sum(1 - q**4 - (1 - q) ** 4 for q in draws) / len(draws)
    assert informative_chance(2, 5, 4) == pytest.approx(simulated, abs=5e-3)


def feed(budget: AdaptiveBudget, prompt: dict, rewards: list[float], groups: int, version: int = 0) -> None:
    for _ in range(groups):
        budget.record(prompt, rewards, version)


def test_prompts_without_signal_fall_to_the_floor_and_middling_ones_stay_admitted() -> None:
    budget = AdaptiveBudget(samples=8, floor=0.1)
    assert budget.admission(DEAD, 0) == 1.0   # never seen: always tried
    feed(budget, DEAD, [0.0] * 8, 1)
    after_one = budget.admission(DEAD, 0)
    feed(budget, DEAD, [0.0] * 8, 9)
    feed(budget, TRIVIAL, [1.0] * 8, 10)
    feed(budget, MIDDLING, [1.0, 0.0] * 4, 10)
    assert 0.1 < after_one < 1.0, "one group is evidence, not a verdict"
    assert budget.admission(DEAD, 0) == budget.admission(TRIVIAL, 0) == 0.1
    assert budget.admission(MIDDLING, 0) == 1.0
    admitted = sum(budget.admit(DEAD, 0) for _ in range(10_000))
    assert 800 < admitted < 1200, "a dead prompt is still tried at the floor's rate"


def test_evidence_fades_as_the_policy_moves_so_a_hard_prompt_is_judged_again() -> None:
    budget = AdaptiveBudget(samples=8, half_life_versions=5)
    feed(budget, DEAD, [0.0] * 8, 10, version=0)
    assert budget.admission(DEAD, 0) == budget.floor
    assert budget.admission(DEAD, 15) > budget.admission(DEAD, 0)
    assert budget.admission(DEAD, 60) > 0.95, "evidence 12 half-lives old still decides"
    budget.record(DEAD, [1.0] + [0.0] * 7, 60)   # the policy learnt it: a success
    assert budget.admission(DEAD, 60) == 1.0


def test_rewards_outside_zero_one_and_nan_are_clipped_not_trusted() -> None:
    budget = AdaptiveBudget(samples=2)
    budget.record(MIDDLING, [5.0, float("nan")], 0)
    seen = budget.evidence[prompt_key(MIDDLING)]
    assert (seen.successes, seen.failures) == (1.0, 1.0)


def test_the_state_survives_a_json_round_trip_and_a_malformed_one_is_refused() -> None:
    budget = AdaptiveBudget(samples=4)
    feed(budget, DEAD, [0.0] * 4, 5, version=3)
    budget.admit(DEAD, 3)
    restored = AdaptiveBudget(samples=4)
    restored.restore(json.loads(json.dumps(budget.state())))
    assert restored.state() == budget.state()
    assert restored.admission(DEAD, 7) == budget.admission(DEAD, 7)
    with pytest.raises(BudgetSettingError, match="malformed"):
        restored.restore({"evidence": {"k": ["x", 1, 2]}})


def test_the_key_is_the_content_not_the_order_of_its_fields() -> None:
    assert prompt_key({"a": 1, "b": [2]}) == prompt_key({"b": [2], "a": 1}) != prompt_key({"a": 2, "b": [2]})


@pytest.mark.parametrize("settings, problem", [
    ({"samples": 1}, "samples 1 < 2"),
    ({"samples": 4, "floor": 0.0}, "never try"),
    ({"samples": 4, "floor": 1.5}, "floor 1.5"),
    ({"samples": 4, "half_life_versions": 0}, "half_life_versions 0"),
])
def test_settings_out_of_range_are_refused_with_the_reason(settings: dict, problem: str) -> None:
    with pytest.raises(BudgetSettingError, match=problem):
        AdaptiveBudget(**settings)
