"""A verifiers v1 taskset written for the tests: three sums, the reward 1 when the reply's last
number is the sum, else 0 (computed by verifiers itself, from the task's own `@vf.reward`).

Run as a task by the `verifiers` handler: {"verifiers": {"taskset": "verifiers_toy",
"path": "<this folder, bound into the sandbox>", "index": 0, "harness": "null"}}.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import verifiers.v1 as vf

SUMS = [(2, 3), (17, 25), (40, 2)]


class SumData(vf.TaskData):
    answer: int


class SumTask(vf.Task[SumData, vf.State]):
    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply)
        return 1.0 if numbers and int(numbers[-1]) == task.answer else 0.0


class SumTaskset(vf.Taskset[SumTask]):
    def load(self) -> Iterator[SumTask]:
        for a, b in SUMS:
            yield SumTask(SumData(prompt=f"What is {a} + {b}? Reply with the number only.", answer=a + b))


__all__ = ["SumTaskset"]
