"""examples/trl_reasoning_gym.py at a tiny size: TRL's GRPOTrainer for 2 steps on reasoning-gym's
count_bits rows through a real worker and serve-llm. Checked: every row is a job of the dataset's
rows, its reward is the dataset's own score_answer of the reply's answer, and the example's
files are written. That the reward rises is the example's full run (docs/trainer.md), not this test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.trainer.api import Spool

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.llm
pytest.importorskip("trl", reason="pip install 'hpc-rollout[trl]' (in the test extra: CI has it)")
reasoning_gym = pytest.importorskip("reasoning_gym", reason="pip install 'hpc-rollout[reasoning-gym]' (in the test extra)")

STEPS, BATCH, SIZE, SEED = 2, 8, 30, 3


def test_the_example_trains_on_reasoning_gym_rows_scored_by_the_dataset(tmp_path: Path) -> None:
    out = tmp_path / "rg"
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "trl_reasoning_gym.py"), "--out", str(out), "--steps", str(STEPS),
         "--batch", str(BATCH), "--generations", "4", "--size", str(SIZE), "--seed", str(SEED), "--warm-steps", "60"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    history = [json.loads(line) for line in (out / "rewards.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [1, 2]
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "done: 2 steps" in done.stdout and "always answering" in done.stdout

    rows = list(Spool.open(out / "spool").reader().rows())
    assert len(rows) == STEPS * BATCH and {r["status"] for r in rows} == {"ok"}
    dataset = reasoning_gym.create_dataset("count_bits", seed=SEED, size=SIZE, min_n=1, max_n=15)
    graded = 0
    for row in rows:
        instance = json.loads(row["instance"])
        assert row["handler"] == "reasoning_gym" and (instance["dataset"], instance["seed"]) == ("count_bits", SEED)
        entry = dataset[instance["index"]]
        result = json.loads(row["result"])
        assert result["question"] == entry["question"], "the row asked its own entry"
        if "answer" in result:   # the reply held <answer>...</answer>: the dataset's scorer decided
            graded += 1
            assert row["reward"] == dataset.score_answer(answer=result["answer"], entry=entry), result
        else:
            assert row["reward"] == 0.0, result
    assert graded, "the warm start teaches the <answer> format: some replies are graded"
    # TRL trained on those rewards: each step's logged reward is the mean of its rows'
    by_version = {v: [r["reward"] for r in rows if r["policy_version_min"] == v] for v in range(STEPS)}
    assert [h["reward"] for h in history] == pytest.approx([sum(r) / len(r) for r in by_version.values()])
