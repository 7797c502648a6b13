"""Reading a task family's rows: its own format, or a verl row (`data_source`, `prompt`,
`reward_model.ground_truth`, `extra_info`), into one flat dict of fields.

A verl row's `extra_info` fields and its ground truth join the row's own top-level fields;
its `prompt` (a list of chat messages) becomes the conversation the agent starts from.
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


def flatten(instance: dict[str, Any]) -> dict[str, Any]:
    """The row's fields with verl's nesting undone (the row's own keys win)."""
    fields: dict[str, Any] = {}
    extra = instance.get("extra_info")
    if isinstance(extra, dict):
        fields.update(extra)
    reward_model = instance.get("reward_model")
    if isinstance(reward_model, dict) and reward_model.get("ground_truth") is not None:
        fields["ground_truth"] = reward_model["ground_truth"]
    fields.update({k: v for k, v in instance.items() if k not in ("extra_info", "reward_model")})
    return fields


def prompt_messages(fields: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A verl `prompt` as chat messages, checked; None when the row has none."""
    prompt = fields.get("prompt")
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("'prompt' must be a non-empty list of {role, content} messages (verl) or a string")
    for index, message in enumerate(prompt):
        if not isinstance(message, dict) or message.get("role") not in ROLES \
                or not isinstance(message.get("content"), str):
            raise ValueError(f"prompt[{index}] must be {{'role': one of {', '.join(ROLES)}, 'content': str}}")
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def first_text(fields: dict[str, Any], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = fields.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return None


def json_value(value: Any, what: str) -> Any:
    """Values that datasets store as JSON strings (SWE-bench's test lists, verl ground truths)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{what} is a string but not JSON: {value[:80]!r}") from None
    return value


def string_list(value: Any, what: str) -> tuple[str, ...]:
    value = json_value(value if value is not None else [], what)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings (or its JSON)")
    return tuple(value)


def optional_image(fields: dict[str, Any]) -> str | None:
    image = fields.get("image")
    if image is not None and not isinstance(image, str):
        raise ValueError("'image' must be a path to a sandbox image")
    return image or None
