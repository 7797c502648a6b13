"""Messages of the agent loop in the OpenAI chat shape, and the cutting of long observations.

Pure functions: what the model's reply becomes in the message history (an assistant message
with `tool_calls`), what a tool's result becomes (a `tool` message), what a malformed call
becomes (a `tool` message starting with "Error:"), and the nudge when a reply has no call.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
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
    return _decoder(tokenizer)(ids)


_STOP_IDS: dict[int, set[int]] = {}
_DECODERS: "weakref.WeakKeyDictionary[Any, Callable[[list[int]], str]]" = weakref.WeakKeyDictionary()
PROBE_IDS = 1024   # the first ids of the vocabulary (bytes, common pieces) and the special ones


def _decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """`tokenizer.decode(ids, skip_special_tokens=False)`, through the Rust tokenizer behind a fast
    one when it gives the same text: transformers' wrapper converts and checks the ids first
    (~20 us a reply, twice what the decoding costs). Used only when no clean-up of spaces is
    configured and it decodes probe ids as the wrapper does (checked once per tokenizer)."""
    try:
        return _DECODERS[tokenizer]
    except (KeyError, TypeError):   # TypeError: an object that takes no weak reference
        pass

    def slow(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    chosen = slow
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is not None and hasattr(rust, "decode") and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        def fast(ids: list[int]) -> str:
            return str(rust.decode(ids, skip_special_tokens=False))

        size = int(getattr(tokenizer, "vocab_size", 0) or 0)
        probe = list(range(min(size, PROBE_IDS))) + sorted(int(i) for i in getattr(tokenizer, "all_special_ids", ()))
        try:
            if probe and fast(probe) == slow(probe) and fast(probe[::7]) == slow(probe[::7]):
                chosen = fast
        except Exception:   # a tokenizer the probe does not fit: the wrapper it is
            chosen = slow
    try:
        _DECODERS[tokenizer] = chosen
    except TypeError:
        pass
    return chosen


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
