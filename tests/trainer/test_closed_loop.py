"""The closed GRPO loop on CPU, shortened: rollouts through the spool, updates, reloads; reward rises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.llm


def test_reward_after_a_few_dozen_steps_is_well_above_the_start(tmp_path: Path) -> None:
    out = tmp_path / "grpo"
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "grpo_tiny.py"), "--out", str(out), "--steps", "120",
         "--stop-at", "0.25", "--lr", "2e-3"],   # the faster rate: a short run stops long before it could collapse
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    history = [json.loads(line) for line in (out / "rewards.jsonl").read_text().splitlines()]
    rewards = [h["reward"] for h in history]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert first < 0.2 and last >= first + 0.15, (first, last, len(rewards))
    assert sum(line.startswith("step ") for line in done.stdout.splitlines()) == len(history)
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(h["reload_s"] > 0 for h in history)      # every step went through a weight swap
    print(f"closed loop: {len(history)} steps, reward {first:.3f} -> {last:.3f}, {history[-1]['t']:.0f} s")
