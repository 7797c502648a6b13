"""The text of a shard row: its prompt from the task, its completion from the handler or the tokens.

A row keeps token ids always; text is where the handler left it:
  prompt      the task (`instance` JSON): "messages" (chat), "prompt" (a string, or verl's list of
              messages), or "question"
  completion  the handler's "response_text" (in the row's `result` JSON, as the chat handler
              writes it), else response_ids decoded by the tokenizer given (every response
              token, observations of a multi-turn agent included)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

Message = dict[str, str]
Prompt = str | list[Message]
PROMPT_KEYS = ("messages", "prompt", "question")
Decode = Callable[[list[int]], str]


def _json(value: Any) -> dict[str, Any]:
    if not isinstance(value, str):
        return {}
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _messages(value: Any) -> list[Message] | None:
    if not isinstance(value, list) or not value:
        return None
    messages = []
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return None
        content = message.get("content")
        messages.append({"role": message["role"], "content": content if isinstance(content, str) else str(content or "")})
    return messages


def prompt_of(row: dict[str, Any]) -> Prompt | None:
    """The row's prompt: a list of chat messages, a string, or None when its task has neither."""
    instance = _json(row.get("instance"))
    for key in PROMPT_KEYS:
        value = instance.get(key)
        if isinstance(value, str) and value:
            return value
        messages = _messages(value)
        if messages:
            return messages
    return None


def completion_of(row: dict[str, Any], decode: Decode | None) -> str | None:
    """The row's completion text, None when the handler kept none and there is no tokenizer."""
    text = _json(row.get("result")).get("response_text")
    if isinstance(text, str):
        return text
    ids = row.get("response_ids")
    if decode is None or ids is None:
        return None
    return decode([int(i) for i in ids])


def as_messages(prompt: Prompt) -> list[Message]:
    return prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]


def last_user_text(prompt: Prompt) -> str:
    """What verl's single-turn SFTDataset takes as its prompt (it wraps it in one user turn)."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m["role"] == "user"]
    return users[-1] if users else prompt[-1]["content"]
