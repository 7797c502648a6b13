"""`python -m benchmarks.proxy --quick` runs end to end and its JSON line (the last) holds every
figure, per API and per harness: the benchmark stays runnable as the proxy changes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.proxy.agent_clis import harness_image_for_tests

pytestmark = [pytest.mark.llm]
REPO = Path(__file__).resolve().parents[2]
KEYS = {"proxy_overhead_median_ms", "proxy_overhead_median_ms_messages", "proxy_overhead_median_ms_responses",
        "proxy_cpu_added_median_ms_messages", "proxy_cpu_added_median_ms_responses", "merge_ratio",
        "merge_ratio_claude_code", "merge_ratio_codex", "load_average"}


@pytest.fixture(scope="module")
def harness_image() -> Path:
    return harness_image_for_tests()


def test_the_quick_benchmark_reports_every_api_and_harness(harness_image: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.proxy", "--quick"], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert KEYS <= set(figures), sorted(KEYS - set(figures))
    # Each harness's calls extend each other: 3 shell calls and the answer merge into one sequence per run.
    assert figures["merge_ratio_claude_code"] == figures["merge_ratio_codex"] == 0.25
    assert "messages, process: added by the proxy" in done.stdout and "codex" in done.stdout
