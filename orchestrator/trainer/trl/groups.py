"""TRL's prompts -> spool groups (their slots in TRL's order: orchestrator/trainer/time_limit.py GroupSlots).

GRPOTrainer hands the rollout function each prompt repeated `num_generations` times (its sampler
repeats indices), and expects one completion per entry, in that order. Equal prompts are one
task: they are submitted as ONE spool group of that many samples, so the group's samples share a
group id as GRPO's advantage does, and every row finds its entry again by (group, sample index).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

Prompt = Any      # TRL's prompt: a string, or a conversation (a list of {"role", "content"} messages)
Task = dict[str, Any]


def chat_task(prompt: Prompt) -> Task:
    """The default task of a prompt: a `chat` job. A string is one user message; a conversation
    is sent as it is (the chat handler renders it with the served model's chat template)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return {"handler": "chat", "instance": {"messages": messages}}


def equal_prompts(prompts: Sequence[Prompt]) -> list[list[int]]:
    """The entries of each distinct prompt, in order of first appearance."""
    groups: dict[bytes, list[int]] = {}
    for index, prompt in enumerate(prompts):
        groups.setdefault(orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS), []).append(index)
    return list(groups.values())


def by_size(groups: list[list[int]]) -> dict[int, list[list[int]]]:
    """Groups bucketed by their number of samples: one submit gives all its tasks the same count."""
    buckets: dict[int, list[list[int]]] = {}
    for members in groups:
        buckets.setdefault(len(members), []).append(members)
    return buckets


def tasks_of(prompts: Sequence[Prompt], members: list[list[int]], task_of: Callable[[Prompt], Task]) -> list[Task]:
    return [task_of(prompts[entries[0]]) for entries in members]
