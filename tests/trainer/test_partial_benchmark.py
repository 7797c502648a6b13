"""`python -m benchmarks.partial --quick` runs end to end and its last line is the JSON it documents
(the figures themselves are the benchmark's business, not a test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.llm
ROOT = Path(__file__).resolve().parents[2]


def test_the_partial_benchmark_quick_prints_its_figures_last() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.partial", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for mode in ("restart", "continue"):
        assert 0.0 <= figures[f"wasted_token_share_{mode}"] < 1.0
        assert figures[f"tokens_per_trained_token_{mode}"] >= 1.0 and figures[f"swaps_{mode}"] >= 1
    assert figures["tokens_per_trained_token_ratio"] == pytest.approx(
        figures["tokens_per_trained_token_restart"] / figures["tokens_per_trained_token_continue"], rel=0.01)
    assert "restart vs continue" in done.stdout and "wasted_token_share_continue" in done.stdout
