"""The Anthropic Messages API (`POST /v1/messages`, what Claude Code speaks), mapped to the chat
template and back.

Request -> template messages:
    system (a string or text blocks)            -> a system message first
    user: text blocks                            -> a user message (blocks joined by newlines)
    user: tool_result blocks                     -> one `tool` message each (tool_call_id =
                                                    tool_use_id), in their place among the text
    assistant: text + tool_use blocks            -> an assistant message with tool_calls
    system turns inside `messages`               -> system messages where they stand
    tools [{name, description, input_schema}]    -> the template's tool declarations
                                                    (defer_loading tools are left out, as the
                                                    API keeps them out of the context)
Reply -> content blocks: text, then one tool_use block per call (input: the arguments object);
stop_reason tool_use | max_tokens | end_turn. `stream: true` answers the API's server-sent
events (message_start, content_block_start/delta/stop with text_delta or input_json_delta,
message_delta, message_stop).

Served as hints without effect (documented in docs/proxy.md): metadata, cache_control,
service_tier, thinking {adaptive | disabled} (the policy's replies carry no thinking blocks),
context_management edits that keep everything, output_config.effort. Refused with the API's
error shape: images, documents and other non-text blocks, thinking blocks in the history,
server tools (web search, code execution, ...), tool_choice any/tool (the proxy cannot force
a call), structured outputs, and any field it does not know.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson

from orchestrator.proxy.api import Problem, sse
from orchestrator.proxy.chat_form import (
    BadRequest, ChatRequest, History, MessageForms, Reply, arguments_object, chat_message, check_fields,
    positive_int, template_call, template_tool,
)
from orchestrator.proxy.nesting import check_fields_nesting
from orchestrator.proxy.typed_fields import FLAG, INTEGER, OBJECT, POSITIVE, PROBABILITY, TEXT, Rule, check_typed

NAME = "anthropic_messages"
FIELDS = {"model", "messages", "system", "max_tokens", "metadata", "stop_sequences", "stream", "temperature",
          "top_k", "top_p", "tools", "tool_choice", "thinking", "context_management", "output_config",
          "service_tier"}
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking", "context_management",
                "output_config"}
TYPED: dict[str, Rule] = {"model": TEXT, "stream": FLAG, "max_tokens": POSITIVE, "temperature": PROBABILITY,
                         "top_p": PROBABILITY, "top_k": INTEGER, "metadata": OBJECT, "service_tier": TEXT}
CONVERTED = ("messages", "system", "tools")   # nesting checked as MessageForms converts them
TOOL_FIELDS = {"type", "name", "description", "input_schema", "cache_control", "defer_loading"}
ERROR_TYPES = {Problem.INVALID: "invalid_request_error", Problem.AUTHENTICATION: "authentication_error",
               Problem.PERMISSION: "permission_error", Problem.NOT_FOUND: "not_found_error",
               Problem.TOO_LARGE: "request_too_large", Problem.CONTEXT_FULL: "invalid_request_error",
               Problem.MAX_TURNS: "invalid_request_error", Problem.BACKEND_GONE: "api_error",
               Problem.SERVER: "api_error"}


def _block_text(block: Any, where: str) -> str:
    if isinstance(block, str):
        return block
    if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
        return block["text"]
    kind = block.get("type") if isinstance(block, dict) else type(block).__name__
    raise BadRequest(f"{where}: {kind!r} content is not served (only text, tool_use and tool_result blocks "
                     "reach the chat template)", param=where)


def _blocks(content: Any, where: str) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return content
    raise BadRequest(f"{where}: content must be a string or a list of content blocks", param=where)


def _text(content: Any, where: str) -> str:
    return "\n".join(_block_text(block, where) for block in _blocks(content, where))


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if pending:
                out.append(chat_message("user", "\n".join(pending)))
                pending = []
            if not isinstance(block.get("tool_use_id"), str):
                raise BadRequest(f"{where}: a tool_result block needs its tool_use_id", param=where)
            out.append(chat_message("tool", _text(block.get("content", ""), f"{where}.tool_result"),
                                    tool_call_id=block["tool_use_id"]))
        else:
            pending.append(_block_text(block, where))
    if pending or not out:
        out.append(chat_message("user", "\n".join(pending)))
    return out


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    texts, calls = [], []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise BadRequest(f"{where}: a tool_use block needs a name and an input object", param=where)
            calls.append(template_call(str(block.get("id") or ""), block["name"], block.get("input", {})))
        elif isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking"):
            raise BadRequest(f"{where}: thinking blocks are not served: this policy's replies carry none, so "
                             "the history came from another model", param=where)
        else:
            texts.append(_block_text(block, where))
    return chat_message("assistant", "\n".join(texts), calls)


def convert_message(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, dict) or raw.get("role") not in ("user", "assistant", "system"):
        raise BadRequest(f"each message needs a role (user, assistant or system); got {str(raw)[:120]!r}",
                         param="messages")
    where = f"messages ({raw['role']})"
    blocks = _blocks(raw.get("content"), where)
    if raw["role"] == "user":
        return _user(blocks, where)
    if raw["role"] == "assistant":
        return [_assistant(blocks, where)]
    return [chat_message("system", _text(blocks, where))]


def convert_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list of tool definitions", param="tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise BadRequest(f"tools: {str(tool)[:80]!r} is not a tool definition", param="tools")
        kind = tool.get("type", "custom")
        if kind not in ("custom", None):
            raise BadRequest(f"tools: server tool {kind!r} ({tool.get('name')}) is not served; only custom tools "
                             "(name, description, input_schema) reach the chat template", param="tools")
        unknown = sorted(set(tool) - TOOL_FIELDS)
        if unknown:
            raise BadRequest(f"tools: field(s) {', '.join(unknown)} of tool {tool.get('name')!r} are not served",
                             param="tools")
        if tool.get("defer_loading"):
            continue
        out.append(template_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"), "tools"))
    return out


def _check_options(body: dict[str, Any]) -> None:
    thinking = body.get("thinking")
    if thinking is not None and (not isinstance(thinking, dict) or thinking.get("type") not in ("adaptive", "disabled")):
        raise BadRequest("thinking: only {\"type\": \"adaptive\"} or \"disabled\" is served: the policy's "
                         "replies carry no thinking blocks", param="thinking")
    management = body.get("context_management")
    if management is not None:
        edits = management.get("edits") if isinstance(management, dict) else None
        for edit in edits if isinstance(edits, list) else [None]:
            keeps_all = isinstance(edit, dict) and str(edit.get("type", "")).startswith("clear_thinking") \
                and edit.get("keep") == "all"
            if not keeps_all:
                raise BadRequest(f"context_management edit {str(edit)[:100]!r} is not served: the proxy keeps the "
                                 "history as the harness sends it", param="context_management")
    output = body.get("output_config")
    if output is not None and (not isinstance(output, dict) or set(output) - {"effort"}):
        raise BadRequest("output_config: only effort (a hint without effect here) is served; structured "
                         "outputs are not", param="output_config")
    choice = body.get("tool_choice")
    if choice is not None and (not isinstance(choice, dict) or choice.get("type") not in ("auto", "none")):
        raise BadRequest("tool_choice: only auto and none are served; the policy decides whether to call a "
                         "tool (any/tool cannot be forced)", param="tool_choice")


class AnthropicMessages:
    """The Anthropic Messages API of one job's proxy."""

    name = NAME

    def __init__(self, forms: MessageForms | None = None) -> None:
        self.forms = forms or MessageForms()

    def parse(self, body: Any, counting: bool = False) -> ChatRequest:
        """The request in a body; `counting`: a count_tokens body (no max_tokens)."""
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        check_fields(body, COUNT_FIELDS if counting else FIELDS, "the Messages API")
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise BadRequest("messages must be a non-empty list", param="messages")
        check_typed(body, TYPED)
        check_fields_nesting(body, CONVERTED)
        _check_options(body)
        history = self.forms.history(NAME, raw, convert_message)
        system = body.get("system")
        if system:
            history = History.of(self.forms.converted(NAME + ":system", system,
                                                      lambda s: [chat_message("system", _text(s, "system"))],
                                                      where="system", above=1)) + history
        tools, tools_key = self.forms.tools(NAME, body.get("tools") or [], convert_tools)
        max_tokens = positive_int(body.get("max_tokens"), "max_tokens")
        if max_tokens is None and not counting:
            raise BadRequest("max_tokens is required", param="max_tokens")
        sampling = {k: body[k] for k in ("temperature", "top_p", "top_k") if body.get(k) is not None}
        stops = body.get("stop_sequences")
        if stops:
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise BadRequest("stop_sequences must be a list of strings", param="stop_sequences")
            sampling["stop"] = list(stops)
        choice = body.get("tool_choice") or {}
        return ChatRequest(
            model=str(body.get("model") or ""), messages=history.messages, keys=history.keys, tools=tools or None,
            tools_key=tools_key,
            sampling=sampling, max_tokens=max_tokens, stream=bool(body.get("stream")),
            parse_tools=bool(tools) and choice.get("type") != "none", api=NAME, call_id_prefix="toolu_")

    # -- answers -----------------------------------------------------------------------------
    @staticmethod
    def content(reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
        for call in reply.calls:
            blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                           "input": arguments_object(call["function"]["arguments"])})
        return blocks

    @staticmethod
    def stop_reason(reply: Reply) -> str:
        if reply.calls:
            return "tool_use"
        return "max_tokens" if reply.finish_reason == "length" else "end_turn"

    @staticmethod
    def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
        return {"input_tokens": input_tokens, "output_tokens": output_tokens,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}

    def answer(self, request: ChatRequest, reply: Reply, model: str) -> dict[str, Any]:
        return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                "model": request.model or model, "content": self.content(reply),
                "stop_reason": self.stop_reason(reply), "stop_sequence": None,
                "usage": self.usage(reply.prompt_tokens, reply.completion_tokens)}

    def events(self, request: ChatRequest, reply: Reply, model: str) -> Iterator[bytes]:
        whole = self.answer(request, reply, model)
        start = {**whole, "content": [], "stop_reason": None, "usage": self.usage(reply.prompt_tokens, 0)}
        yield sse({"type": "message_start", "message": start}, "message_start")
        for index, block in enumerate(whole["content"]):
            opened: dict[str, Any]
            if block["type"] == "text":
                opened, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
            else:
                opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                delta = {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
            yield sse({"type": "content_block_start", "index": index, "content_block": opened}, "content_block_start")
            yield sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
            yield sse({"type": "content_block_stop", "index": index}, "content_block_stop")
        yield sse({"type": "message_delta", "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": None},
                   "usage": {"output_tokens": reply.completion_tokens}}, "message_delta")
        yield sse({"type": "message_stop"}, "message_stop")

    def error(self, problem: Problem, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
        return {"type": "error", "error": {"type": ERROR_TYPES[problem], "message": message}}

    # -- the other endpoints a client probes ---------------------------------------------------
    @staticmethod
    def model_entry(model: str) -> dict[str, Any]:
        return {"type": "model", "id": model, "display_name": model, "created_at": "1970-01-01T00:00:00Z"}

    def models(self, model: str) -> dict[str, Any]:
        return {"data": [self.model_entry(model)], "has_more": False, "first_id": model, "last_id": model}
