"""The OpenAI Responses API (`POST /v1/responses`, what Codex CLI speaks), mapped to the chat
template and back.

Request -> template messages:
    instructions                                  -> a system message first
    input: a string                               -> a user message
    input items: message (system, developer, user, assistant; input_text/output_text parts,
                 joined by newlines)              -> a message of that role
    function_call items (after an assistant message or on their own)
                                                  -> the tool_calls of one assistant message
    function_call_output                          -> a `tool` message (tool_call_id = call_id)
    previous_response_id (a response this job's proxy gave) -> that response's input and output
                                                    before the new input
    tools [{type: function, name, description, parameters}] -> the template's tool declarations
Reply -> output items: a message (output_text) when there is text, then one function_call per
call; status `incomplete` (incomplete_details.reason max_output_tokens) when cut. `stream: true`
answers the API's typed server-sent events (response.created ... response.completed).

Served as hints without effect (docs/proxy.md): store, include reasoning.encrypted_content
(no reasoning items are produced), reasoning, prompt_cache_key, client_metadata, metadata,
service_tier, text.verbosity, truncation "disabled", user, safety_identifier, stream_options.
Refused with the API's error shape: images, files, reasoning items and any other item type,
hosted tools (web search, file search, ...), tool namespaces and custom (freeform) tools,
tool_choice required/a named tool, structured output formats, background, conversation,
stored prompts, top_logprobs, truncation "auto", and any field it does not know.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from orchestrator.proxy.api import Problem, sse
from orchestrator.proxy.chat_form import (
    BadRequest, ChatRequest, Form, History, MessageForms, Reply, chat_message, check_fields, positive_int,
    template_call, template_tool,
)
from orchestrator.proxy.chat_completions import ERROR_CODES, ERROR_TYPES, error_body
from orchestrator.proxy.nesting import check_arguments, check_fields_nesting
from orchestrator.proxy.typed_fields import FLAG, OBJECT, POSITIVE, PROBABILITY, TEXT, Rule, check_typed, number

NAME = "openai_responses"
FIELDS = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
          "temperature", "top_p", "stream", "store", "include", "reasoning", "prompt_cache_key", "client_metadata",
          "metadata", "previous_response_id", "service_tier", "text", "truncation", "user", "safety_identifier",
          "stream_options"}
TYPED: dict[str, Rule] = {
    "model": TEXT, "instructions": TEXT, "stream": FLAG, "store": FLAG, "parallel_tool_calls": FLAG,
    "max_output_tokens": POSITIVE, "temperature": number(0, 2), "top_p": PROBABILITY,
    "previous_response_id": TEXT, "metadata": OBJECT, "prompt_cache_key": TEXT, "user": TEXT,
    "safety_identifier": TEXT, "service_tier": TEXT, "stream_options": OBJECT, "reasoning": OBJECT,
}
CONVERTED = ("input", "tools")   # nesting checked as MessageForms converts them
INCLUDES = {"reasoning.encrypted_content"}
MESSAGE_ROLES = ("system", "developer", "user", "assistant")
ECHOED = ("instructions", "parallel_tool_calls", "previous_response_id", "reasoning", "store", "temperature", "text",
          "top_p", "truncation", "max_output_tokens", "metadata", "tool_choice", "tools")
KEPT_RESPONSES = 256     # previous_response_id reaches this many of the job's latest responses


def _parts_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}: content must be a string or a list of parts", param="input")
    texts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text") \
                and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise BadRequest(f"{where}: {kind!r} content is not served (only input_text/output_text reach the "
                             "chat template)", param="input")
    return "\n".join(texts)


def _kind(item: Any) -> str:
    if not isinstance(item, dict):
        raise BadRequest(f"input: {str(item)[:80]!r} is not an item", param="input")
    return str(item.get("type") or ("message" if "role" in item else ""))


def _call(item: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
        raise BadRequest("input: a function_call item needs name and call_id", param="input")
    return template_call(item["call_id"], item["name"], item.get("arguments") or "{}")


def convert_group(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One unit of input: a message (an assistant message with the function calls after it), a
    run of function calls, or a function_call_output."""
    head = group[0]
    kind = _kind(head)
    if kind == "function_call_output":
        if not isinstance(head.get("call_id"), str):
            raise BadRequest("input: a function_call_output item needs its call_id", param="input")
        return [chat_message("tool", _parts_text(head.get("output", ""), "function_call_output"),
                             tool_call_id=head["call_id"])]
    if kind == "function_call":
        return [chat_message("assistant", "", [_call(item) for item in group])]
    if head.get("role") not in MESSAGE_ROLES:
        raise BadRequest(f"input: message role {head.get('role')!r}; served: {', '.join(MESSAGE_ROLES)}",
                         param="input")
    calls = [_call(item) for item in group[1:]]
    return [chat_message(head["role"], _parts_text(head.get("content"), f"{head['role']} message"), calls)]


def convert_input_group(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`convert_group` for a request's input: its function calls' arguments are checked too (a
    reply's own items, converted to be kept, are not: they are what the policy wrote)."""
    for item in group:
        if isinstance(item, dict) and item.get("type") == "function_call":
            check_arguments(item.get("arguments"), "input (function_call arguments)")
    return convert_group(group)


def groups_of(items: list[Any]) -> list[list[dict[str, Any]]]:
    """Input items cut into units: function calls join the assistant message before them."""
    groups: list[list[dict[str, Any]]] = []
    for item in items:
        kind = _kind(item)
        if kind not in ("message", "function_call", "function_call_output"):
            raise BadRequest(f"input: {kind or 'untyped'!r} items are not served (only message, function_call "
                             "and function_call_output reach the chat template)", param="input")
        if kind == "function_call" and groups and (
                _kind(groups[-1][-1]) == "function_call"
                or (_kind(groups[-1][0]) == "message" and groups[-1][0].get("role") == "assistant")):
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def convert_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out = []
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            what = f"{kind!r} tools" if kind else "untyped tools"
            raise BadRequest(f"tools: {what} ({tool.get('name') if isinstance(tool, dict) else tool}) are not "
                             "served; only function tools reach the chat template", param="tools")
        if tool.get("strict"):
            raise BadRequest(f"tools: strict schemas ({tool.get('name')}) are not served: the policy's arguments "
                             "are not constrained to them", param="tools")
        out.append(template_tool(tool.get("name"), tool.get("description"), tool.get("parameters"), "tools"))
    return out


def _check_options(body: dict[str, Any]) -> None:
    refused = {"background": bool(body.get("background")), "top_logprobs": bool(body.get("top_logprobs"))}
    for name, bad in refused.items():
        if bad:
            raise BadRequest(f"{name} is not served by this proxy", param=name)
    include = body.get("include") or []
    if not isinstance(include, list) or set(include) - INCLUDES:
        raise BadRequest(f"include: only {', '.join(sorted(INCLUDES))} is served (this proxy produces no reasoning "
                         f"items, so it is empty); got {include!r}", param="include")
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        raise BadRequest("tool_choice: only auto and none are served; the policy decides whether to call a tool "
                         "(required or a named tool cannot be forced)", param="tool_choice")
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if not isinstance(text, dict) or set(text) - {"format", "verbosity"} or \
                (fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text")):
            raise BadRequest("text: only the plain text format is served; structured outputs are not", param="text")
    if body.get("truncation") not in (None, "disabled"):
        raise BadRequest("truncation: only \"disabled\" is served; the proxy keeps the input as sent",
                         param="truncation")


class OpenAIResponses:
    """The Responses API of one job's proxy (it keeps the job's latest responses for
    previous_response_id)."""

    name = NAME

    def __init__(self, forms: MessageForms | None = None) -> None:
        self.forms = forms or MessageForms()
        self._kept: OrderedDict[str, tuple[Form, ...]] = OrderedDict()

    def parse(self, body: Any) -> ChatRequest:
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        check_fields(body, FIELDS, "the Responses API")
        check_typed(body, TYPED)
        check_fields_nesting(body, CONVERTED)
        _check_options(body)
        raw = body.get("input")
        if isinstance(raw, str):
            raw = [{"type": "message", "role": "user", "content": raw}]
        if not isinstance(raw, list) or not raw:
            raise BadRequest("input must be a string or a non-empty list of items", param="input")
        # The last group may still grow (function calls join the message before them): not settled.
        history = self.forms.history(NAME, raw, convert_input_group, units=groups_of,
                                     open_items=lambda groups: len(groups[-1]) if groups else 0, where="input", above=1)
        previous = body.get("previous_response_id")
        if previous is not None:
            if previous not in self._kept:
                raise BadRequest(f"previous response {previous!r} not found: this proxy keeps the last "
                                 f"{KEPT_RESPONSES} responses of this job", param="previous_response_id",
                                 code="previous_response_not_found", status=404)
            history = History.of(self._kept[previous]) + history
        conversation = history.forms
        instructions = body.get("instructions")
        if instructions:
            if not isinstance(instructions, str):
                raise BadRequest("instructions must be a string", param="instructions")
            history = History.of(self.forms.converted(NAME + ":instructions", instructions,
                                                      lambda text: [chat_message("system", text)])) + history
        messages, keys = history.messages, history.keys
        tools, tools_key = self.forms.tools(NAME, body.get("tools") or [], convert_tools)
        sampling = {k: body[k] for k in ("temperature", "top_p") if body.get(k) is not None}
        echo = {k: body.get(k) for k in ECHOED}
        return ChatRequest(
            model=str(body.get("model") or ""), messages=messages, keys=keys, tools=tools or None,
            tools_key=tools_key, sampling=sampling,
            max_tokens=positive_int(body.get("max_output_tokens"), "max_output_tokens"),
            stream=bool(body.get("stream")), parse_tools=bool(tools) and body.get("tool_choice") != "none",
            api=NAME, call_id_prefix="call_", context={"echo": echo, "conversation": conversation})

    # -- answers -----------------------------------------------------------------------------
    @staticmethod
    def output(reply: Reply, response_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        status = "incomplete" if reply.truncated else "completed"
        if reply.text or not reply.calls:
            items.append({"id": f"msg_{response_id[5:]}", "type": "message", "role": "assistant", "status": status,
                          "content": [{"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}]})
        for call in reply.calls:
            items.append({"id": f"fc_{call['id'].removeprefix('call_')}", "type": "function_call",
                          "call_id": call["id"], "name": call["function"]["name"],
                          "arguments": call["function"]["arguments"], "status": "completed"})
        return items

    def _remember(self, request: ChatRequest, response_id: str, reply: Reply) -> None:
        conversation = request.context["conversation"]
        answered = tuple(form for item in self.output(reply, response_id)
                         for group in groups_of([item]) for form in self.forms.converted(NAME, group, convert_group))
        self._kept[response_id] = conversation + answered
        while len(self._kept) > KEPT_RESPONSES:
            self._kept.popitem(last=False)

    def answer(self, request: ChatRequest, reply: Reply, model: str) -> dict[str, Any]:
        response_id = f"resp_{uuid.uuid4().hex}"
        self._remember(request, response_id, reply)
        echo = request.context["echo"]
        body: dict[str, Any] = {
            "id": response_id, "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": request.model or model, "output": self.output(reply, response_id),
            "error": None, "incomplete_details": None,
            "instructions": echo.get("instructions"), "metadata": echo.get("metadata") or {},
            "parallel_tool_calls": echo.get("parallel_tool_calls", True) is not False,
            "previous_response_id": echo.get("previous_response_id"), "reasoning": echo.get("reasoning"),
            "store": echo.get("store", False), "temperature": echo.get("temperature"), "top_p": echo.get("top_p"),
            "text": echo.get("text") or {"format": {"type": "text"}}, "tool_choice": echo.get("tool_choice") or "auto",
            "tools": echo.get("tools") or [], "truncation": echo.get("truncation") or "disabled",
            "max_output_tokens": echo.get("max_output_tokens"),
            "usage": {"input_tokens": reply.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": reply.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": reply.prompt_tokens + reply.completion_tokens},
        }
        if reply.truncated:
            body["status"], body["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        return body

    def events(self, request: ChatRequest, reply: Reply, model: str) -> Iterator[bytes]:
        whole = self.answer(request, reply, model)
        sequence = iter(range(1 << 30))

        def event(kind: str, **fields: Any) -> bytes:
            return sse({"type": kind, "sequence_number": next(sequence), **fields}, kind)

        opening = {**whole, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        yield event("response.created", response=opening)
        yield event("response.in_progress", response=opening)
        for index, item in enumerate(whole["output"]):
            if item["type"] == "message":
                part = item["content"][0]
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "content": []})
                place = {"item_id": item["id"], "output_index": index, "content_index": 0}
                yield event("response.content_part.added", **place, part={**part, "text": ""})
                if part["text"]:
                    yield event("response.output_text.delta", **place, delta=part["text"], logprobs=[])
                yield event("response.output_text.done", **place, text=part["text"], logprobs=[])
                yield event("response.content_part.done", **place, part=part)
            else:
                yield event("response.output_item.added", output_index=index,
                            item={**item, "arguments": "", "status": "in_progress"})
                place = {"item_id": item["id"], "output_index": index}
                yield event("response.function_call_arguments.delta", **place, delta=item["arguments"])
                yield event("response.function_call_arguments.done", **place, arguments=item["arguments"],
                            name=item["name"])
            yield event("response.output_item.done", output_index=index, item=item)
        yield event("response.incomplete" if whole["status"] == "incomplete" else "response.completed", response=whole)

    def error(self, problem: Problem, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
        return error_body(message, ERROR_TYPES[problem], code or ERROR_CODES.get(problem), param)
