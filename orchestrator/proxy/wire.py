"""OpenAI chat-completions shapes: what a harness sends and what it gets back.

Pure functions. A request's messages get two forms: `template_message` (what the chat template
renders: content flattened to text, only the keys templates read) and `message_key` (what
decides whether a request repeats an earlier one: role, text, tool calls with their arguments
as parsed JSON, tool_call_id). Keys ignore what clients add when they echo a reply back
(`provider_specific_fields`, `refusal`, `function_call: null`, call ids, argument spacing).
A harness resends its whole history on every call: `MessageForms` (one per job) converts each
distinct message once, so a call's cost does not grow with the conversation.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from orchestrator.agent.calls import ParsedReply, ToolCall
from orchestrator.errors import HpcRolloutError

# Sampling parameters a harness may set; the job's own sampling parameters win over them.
PASSED_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                   "frequency_penalty", "repetition_penalty")
ROLES = ("system", "developer", "user", "assistant", "tool")


class BadRequest(HpcRolloutError, ValueError):
    """A request the proxy cannot serve; answered with HTTP 400 and this text."""


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[dict[str, Any], ...]          # as the template renders them
    keys: tuple[tuple[Any, ...], ...]             # message_key of each
    tools: list[dict[str, Any]] | None
    tools_key: str
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    parse_tools: bool = True


def text_of(content: Any) -> str:
    """Message content as text: a string, None, or a list of parts ({"type": "text", "text"})."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise BadRequest(f"message content part {str(part)[:80]!r} is not text; only text parts are supported")
        return "".join(parts)
    raise BadRequest(f"message content must be a string or a list of text parts, got {type(content).__name__}")


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            return value
    return value


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise BadRequest("tool_calls must be a list")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"tool call {str(call)[:120]!r} has no function name")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append({"id": str(call.get("id") or ""), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def template_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise BadRequest(f"each message needs a role ({', '.join(ROLES)}); got {str(message)[:120]!r}")
    out: dict[str, Any] = {"role": message["role"], "content": text_of(message.get("content"))}
    calls = _calls(message)
    if calls:
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    return out


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two messages the same turn (see the module's docstring)."""
    calls = tuple((c["function"]["name"], json.dumps(_arguments(c["function"]["arguments"]), sort_keys=True))
                  for c in message.get("tool_calls") or ())
    return (message["role"], str(message.get("content") or "").strip(), calls, message.get("tool_call_id") or "")


class MessageForms:
    """The template form and key of each message a job's harness sent, by the message's JSON: the
    history a harness resends is converted once (messages are small; the bytes are the dict's
    own order, so a client that reorders keys only misses the cache). Bounded by `limit` entries."""

    def __init__(self, limit: int = 20_000) -> None:
        self.limit = limit
        self._forms: dict[bytes, tuple[dict[str, Any], tuple[Any, ...]]] = {}
        self._tools: dict[bytes, str] = {}

    def message(self, raw: Any) -> tuple[dict[str, Any], tuple[Any, ...]]:
        if not isinstance(raw, dict):
            template_message(raw)   # raises BadRequest naming the problem
        blob = orjson.dumps(raw)
        forms = self._forms.get(blob)
        if forms is None:
            message = template_message(raw)
            forms = (message, message_key(message))
            if len(self._forms) >= self.limit:
                self._forms.clear()
            self._forms[blob] = forms
        return forms

    def tools_key(self, tools: list[dict[str, Any]]) -> str:
        blob = orjson.dumps(tools)
        key = self._tools.get(blob)
        if key is None:
            key = json.dumps(tools, sort_keys=True)
            if len(self._tools) >= 64:
                self._tools.clear()
            self._tools[blob] = key
        return key


def parse_request(body: Any, parse_tools_default: bool = True, forms: MessageForms | None = None) -> ChatRequest:
    """The request in a chat-completions body; `forms`: the job's cache of converted messages."""
    forms = forms or MessageForms()
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list")
    if int(body.get("n") or 1) != 1:
        raise BadRequest("n must be 1: the proxy records one sample per call")
    converted = [forms.message(m) for m in raw]
    tools = body.get("tools") or None
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of function declarations")
    sampling = {k: body[k] for k in PASSED_SAMPLING if body.get(k) is not None}
    wanted = body.get("max_completion_tokens", body.get("max_tokens"))
    if wanted is not None and (isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1):
        raise BadRequest(f"max_tokens must be a positive integer, got {wanted!r}")
    options = body.get("stream_options") or {}
    return ChatRequest(
        model=str(body.get("model") or ""), messages=tuple(m for m, _ in converted), keys=tuple(k for _, k in converted),
        tools=tools, tools_key=forms.tools_key(tools) if tools else "", sampling=sampling,
        max_tokens=wanted, stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        parse_tools=parse_tools_default and bool(tools) and body.get("tool_choice") != "none",
    )


def reply_message(parsed: ParsedReply | None, text: str, call_prefix: str) -> dict[str, Any]:
    """The assistant message of a reply. A reply with a malformed call is returned as plain text
    (as vLLM's parsers do): the harness sees exactly what the model wrote."""
    if parsed is None or parsed.errors or not parsed.calls:
        return {"role": "assistant", "content": text if parsed is None or parsed.errors else parsed.content}
    calls = [ToolCall(c.name, c.arguments, f"{call_prefix}_{i}").to_openai() for i, c in enumerate(parsed.calls)]
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}


def finish_reason(message: dict[str, Any], backend_reason: str) -> str:
    if message.get("tool_calls"):
        return "tool_calls"
    return "length" if backend_reason == "length" else "stop"


def completion_body(model: str, message: dict[str, Any], reason: str, prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": model, "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reason}],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def stream_chunks(body: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed answer to a completed reply: role, text, each tool call, the end."""
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    choice = body["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}

    yield chunk({"role": "assistant", "content": ""})
    if message.get("content"):
        yield chunk({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or ()):
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"],
                                                  "arguments": call["function"]["arguments"]}}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield {**base, "choices": [], "usage": body["usage"]}


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
