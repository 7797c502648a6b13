"""Messages of the agent loop in the OpenAI chat shape, and the cutting of long observations.

Pure functions: what the model's reply becomes in the message history (an assistant message
with `tool_calls`), what a tool's result becomes (a `tool` message), what a malformed call
becomes (a `tool` message starting with "Error:"), and the nudge when a reply has no call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.agent.calls import ParsedReply, ToolCall
from orchestrator.sandbox.server.tools.output import HeadTail

DEFAULT_MAX_OBSERVATION_CHARS = 8000


def reply_text(tokenizer: Any, output_ids: Sequence[int], finish_reason: str) -> str:
    """The sampled text as the parser must see it: special tokens kept (a template may make
    <tool_call> special), the stop token the server matched dropped."""
    ids = list(output_ids)
    if ids and finish_reason == "stop" and ids[-1] in _stop_ids(tokenizer):
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


_STOP_IDS: dict[int, set[int]] = {}


def _stop_ids(tokenizer: Any) -> set[int]:
    # The tokenizer's special-token properties are slow to read; they do not change.
    found = _STOP_IDS.get(id(tokenizer))
    if found is None:
        found = _STOP_IDS[id(tokenizer)] = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
    return found


def with_call_ids(calls: Sequence[ToolCall], turn: int) -> list[ToolCall]:
    """Give each call of a turn an id unique within the conversation (tool messages cite it)."""
    return [ToolCall(c.name, c.arguments, c.id or f"call_{turn}_{index}") for index, c in enumerate(calls)]


def assistant_message(parsed: ParsedReply, calls: Sequence[ToolCall]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if calls:
        message["tool_calls"] = [call.to_openai() for call in calls]
    return message


def tool_message(call: ToolCall, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


def error_message(error: str) -> dict[str, Any]:
    return {"role": "tool", "name": "error", "content": f"Error: {error}"}


def nudge_message(tool_names: Sequence[str]) -> dict[str, Any]:
    return {"role": "user", "content": (
        "Your reply contained no tool call. Use one of the tools "
        f"({', '.join(tool_names)}), or call the tool that ends the task when you are done.")}


def cut_middle(text: str, limit: int = DEFAULT_MAX_OBSERVATION_CHARS) -> tuple[str, bool]:
    """Keep the head and the tail of a long text with a marker in between; (text, was cut)."""
    if len(text) <= limit:
        return text, False
    sink = HeadTail(limit)
    sink.add(text)
    return sink.text(), True
