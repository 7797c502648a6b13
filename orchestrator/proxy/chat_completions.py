"""OpenAI chat completions (`POST /v1/chat/completions`): what a harness sends and gets back.

Messages are already in the chat template's form; their content is flattened to text (a string
or text parts, joined as they are) and only the keys templates read are kept. `stream: true`
answers server-sent events (`stream_options.include_usage` honoured).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from orchestrator.proxy.api import Problem, sse
from orchestrator.proxy.chat_form import (
    PASSED_SAMPLING, ROLES, BadRequest, ChatRequest, MessageForms, Reply, template_call,
)
from orchestrator.proxy.nesting import check_arguments, check_fields_nesting
from orchestrator.proxy.typed_fields import (
    FLAG, INTEGER, OBJECT, ONE, PENALTY, POSITIVE, POSITIVE_NUMBER, PROBABILITY, TEXT, TEXTS, Rule, check_typed, number,
)

NAME = "chat_completions"
ERROR_TYPES = {Problem.INVALID: "invalid_request_error", Problem.AUTHENTICATION: "authentication_error",
               Problem.PERMISSION: "permission_error", Problem.NOT_FOUND: "not_found_error",
               Problem.TOO_LARGE: "invalid_request_error", Problem.CONTEXT_FULL: "invalid_request_error",
               Problem.MAX_TURNS: "invalid_request_error", Problem.BACKEND_GONE: "server_error",
               Problem.SERVER: "server_error"}
TYPED: dict[str, Rule] = {
    "model": TEXT, "stream": FLAG, "stream_options": OBJECT, "n": ONE, "max_tokens": POSITIVE,
    "max_completion_tokens": POSITIVE, "temperature": number(0, 2), "top_p": PROBABILITY, "top_k": INTEGER,
    "min_p": PROBABILITY, "seed": INTEGER, "stop": TEXTS, "presence_penalty": PENALTY, "frequency_penalty": PENALTY,
    "repetition_penalty": POSITIVE_NUMBER, "parallel_tool_calls": FLAG,
}
STREAM_OPTIONS = {"include_usage": FLAG}
CONVERTED = ("messages", "tools")   # nesting checked as MessageForms converts them
ERROR_CODES = {Problem.AUTHENTICATION: "invalid_api_key", Problem.NOT_FOUND: "unknown_url",
               Problem.TOO_LARGE: "request_too_large", Problem.CONTEXT_FULL: "context_length_exceeded",
               Problem.MAX_TURNS: "max_turns_reached", Problem.BACKEND_GONE: "backend_unavailable"}


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


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise BadRequest("tool_calls must be a list")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"tool call {str(call)[:120]!r} has no function name")
        check_arguments(function.get("arguments"), "messages (tool call arguments)")
        out.append(template_call(str(call.get("id") or ""), function["name"], function.get("arguments", "{}")))
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


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of function declarations", param="tools")
    return tools


def parse_request(body: Any, parse_tools_default: bool = True, forms: MessageForms | None = None) -> ChatRequest:
    """The request in a chat-completions body; `forms`: the job's cache of converted messages."""
    forms = forms or MessageForms()
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    check_typed(body, TYPED)
    options = body.get("stream_options") or {}
    check_typed(options, STREAM_OPTIONS)
    check_fields_nesting(body, CONVERTED)
    history = forms.history(NAME, raw, lambda m: [template_message(m)])
    tools, tools_key = forms.tools(NAME, body.get("tools") or [], _tools)
    sampling = {k: body[k] for k in PASSED_SAMPLING if body.get(k) is not None}
    wanted = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest(
        model=str(body.get("model") or ""), messages=history.messages, keys=history.keys, tools=tools or None,
        tools_key=tools_key,
        sampling=sampling, max_tokens=wanted, stream=bool(body.get("stream")),
        include_usage=bool(options.get("include_usage")),
        parse_tools=parse_tools_default and bool(tools) and body.get("tool_choice") != "none",
    )


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


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class ChatCompletions:
    """The chat-completions API of one job's proxy."""

    name = NAME

    def __init__(self, forms: MessageForms | None = None) -> None:
        self.forms = forms or MessageForms()

    def parse(self, body: Any) -> ChatRequest:
        return parse_request(body, forms=self.forms)

    def answer(self, request: ChatRequest, reply: Reply, model: str) -> dict[str, Any]:
        return completion_body(request.model or model, reply.message, finish_reason(reply.message, reply.finish_reason),
                               reply.prompt_tokens, reply.completion_tokens)

    def events(self, request: ChatRequest, reply: Reply, model: str) -> Iterator[bytes]:
        for chunk in stream_chunks(self.answer(request, reply, model), request.include_usage):
            yield sse(chunk)
        yield b"data: [DONE]\n\n"

    def error(self, problem: Problem, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
        return error_body(message, ERROR_TYPES[problem], code or ERROR_CODES.get(problem), param)
