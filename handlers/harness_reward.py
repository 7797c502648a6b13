"""A reward the harness reports itself (AgentCore-style apps score their own rollouts).

The harness writes it to the file named by $HPC_ROLLOUT_REWARD_FILE in its sandbox, as a JSON
number (`0.75`) or object (`{"reward": 0.75}`). RUN reads it before the sandbox closes; it is
checked by type (a finite number, not a boolean) and range (`harness.reward_range`, default
[0, 1]). With `harness.reward = "reported"` it is the row's reward (a missing or bad report fails
the job, saying why); with the default "family" the task family's EVAL scores the job and the
report is kept beside it in the row's `result` (`reported_reward`).
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any

REWARD_FILE = "/workspace/.harness/reward.json"
MAX_REPORT_BYTES = 64 * 1024


class RewardSource(str, enum.Enum):
    FAMILY = "family"       # the task family's EVAL (swe tests, code tests, math answer)
    REPORTED = "reported"   # what the harness wrote to $HPC_ROLLOUT_REWARD_FILE


def parse_reward_range(value: Any) -> tuple[float, float]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
            or value[0] > value[1]):
        raise ValueError(f"harness reward_range must be [low, high] with low <= high, got {value!r}")
    return float(value[0]), float(value[1])


def parse_report(content: bytes, low: float, high: float) -> float:
    """The reward in a report, or ValueError naming what is wrong with it."""
    if len(content) > MAX_REPORT_BYTES:
        raise ValueError(f"the reported reward file holds {len(content)} bytes; write one number")
    try:
        data = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"the reported reward {content[:80]!r} is not JSON: write a number such as 0.75 "
                         f"or {{\"reward\": 0.75}}") from None
    value = data.get("reward") if isinstance(data, dict) else data
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"the reported reward {value!r} is not a finite number")
    if not low <= value <= high:
        raise ValueError(f"the reported reward {value:g} is outside the harness reward_range [{low:g}, {high:g}]")
    return float(value)


async def read_report(sandbox: Any, low: float, high: float) -> dict[str, Any]:
    """RUN's output keys: {"reported_reward": x}, {"reported_reward_error": why}, or {} (no report)."""
    fetched = await sandbox.download(REWARD_FILE)
    if fetched.error or fetched.content is None:
        return {}
    try:
        return {"reported_reward": parse_report(fetched.content, low, high)}
    except ValueError as exc:
        return {"reported_reward_error": str(exc)}


def reported_reward(result: dict[str, Any]) -> float:
    """The reward a harness reported in RUN's `result`, or ValueError saying why there is none."""
    if "reported_reward_error" in result:
        raise ValueError(str(result["reported_reward_error"]))
    if "reported_reward" not in result:
        raise ValueError("the harness reported no reward: write it to $HPC_ROLLOUT_REWARD_FILE "
                         f"({REWARD_FILE}), or set harness.reward = \"family\"")
    return float(result["reported_reward"])
