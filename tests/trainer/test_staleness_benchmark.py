"""`python -m benchmarks.staleness --quick` runs end to end and its last line is the JSON it documents,
its figures consistent with each other (the figures themselves are the benchmark's business)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.llm
ROOT = Path(__file__).resolve().parents[2]


def test_the_staleness_benchmark_quick_prints_each_policys_slow_shares_last() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.staleness", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for mode in ("restart", "restart_always", "continue"):
        submitted, trained = figures[f"slow_submitted_share_{mode}"], figures[f"slow_trained_share_{mode}"]
        assert 0.0 < submitted < 1.0 and 0.0 <= trained <= 1.0
        assert figures[f"slow_share_ratio_{mode}"] == pytest.approx(trained / submitted, abs=1e-3)
        assert 0.0 <= figures[f"wasted_token_share_{mode}"] < 1.0 and figures[f"swaps_{mode}"] >= 1
        prompts, samples = figures[f"prompts_submitted_{mode}"], figures[f"samples_trained_{mode}"]
        assert submitted == pytest.approx(prompts["slow"] / (prompts["fast"] + prompts["slow"]), abs=1e-3)
        assert trained == pytest.approx(samples["slow"] / (samples["fast"] + samples["slow"]), abs=1e-3)
        # A stale group's prompt is resubmitted, not replaced: no class trains more groups than it drew.
        in_flight = figures[f"in_flight_at_stop_{mode}"]
        assert all(count >= 0 for count in in_flight.values()) and figures[f"failed_groups_{mode}"] >= 0
        assert figures[f"groups_trained_{mode}"] == sum(prompts.values()) - sum(in_flight.values())
        assert sum(samples.values()) == figures[f"groups_trained_{mode}"] * 2   # --quick: 2 samples a group
    assert "restart at every try" in done.stdout and "slow_share_ratio_restart" in done.stdout
