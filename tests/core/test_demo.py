"""The README's main command: `hpc-rollout demo` runs real chat jobs against serve-llm --tiny."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds


def test_demo_end_to_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "demo", "--dir", str(run_dir),
         "--tasks", "3", "--samples", "2", "--max-tokens", "8"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = ds.dataset(run_dir / "shards", format="parquet").to_table().to_pylist()
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok"}
    for row in rows:
        assert len(row["turns"]) == 2  # the first question and one follow-up turn
        mask, logprobs = row["response_mask"], row["logprobs"]
        assert len(mask) == len(logprobs) == len(row["response_ids"]) > sum(mask) > 0
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0)
        assert all(lp < 0.0 for lp, m in zip(logprobs, mask) if m == 1)
    assert "6 trajectories (6 ok)" in result.stdout
    # the summary's time is the bar's (queued to stored), the whole demo's beside it (issue 39)
    said = re.search(r"in ([0-9.]+) s from queued to stored \(([0-9.]+) s with the server", result.stdout)
    assert said and float(said.group(1)) < float(said.group(2)), result.stdout
    assert not list((run_dir / "workers").glob("*.json")), "every worker stopped"
