"""Tool-call parsers, chosen by name: model text in, calls and malformed-call errors out.

    parse = get_parser("hermes")
    reply = parse('Let me check.<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>')
    reply.calls[0].name == "bash"; reply.content == "Let me check."

Families (the names vLLM's `--tool-call-parser` uses):
    hermes, qwen   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number of them
    mistral        [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
    llama3_json    the whole reply is {"name": ..., "parameters": {...}} (several: separated by ';'),
                   optionally after <|python_tag|>
A malformed call (bad JSON, no name, arguments that are not an object, an unclosed tag) is
never an exception: it becomes one entry of `errors`, worded for the model to read and fix.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from orchestrator.agent.calls import ParsedReply, ToolCall
from orchestrator.agent.json_depth import MAX_NESTING, nests_within

Parser = Callable[[str], ParsedReply]
MAX_QUOTED = 200


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + "..."


def call_from_object(obj: Any, index: int) -> ToolCall | str:
    """A ToolCall from a decoded {"name", "arguments"|"parameters"} object, or the error text."""
    if not nests_within(obj, MAX_NESTING):   # before anything recursive (json.dumps, orjson) reads it
        return _too_deep(index)
    if not isinstance(obj, dict):
        return f"tool call {index}: expected a JSON object with \"name\" and \"arguments\", got {_short(json.dumps(obj))}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return f"tool call {index}: \"name\" must be a non-empty string, got {_short(json.dumps(obj))}"
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return f"tool call {index} ({name}): \"arguments\" is a string but not JSON: {exc}"
        except RecursionError:
            return _too_deep(index)
    if not nests_within(arguments, MAX_NESTING - 1):   # the call object is the first level
        return _too_deep(index)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f"tool call {index} ({name}): \"arguments\" must be a JSON object, got {_short(json.dumps(arguments))}"
    return ToolCall(name=name, arguments=arguments)


def _too_deep(index: int) -> str:
    return (f"tool call {index}: its JSON nests deeper than {MAX_NESTING} levels of objects and arrays; "
            "write flatter arguments")


def _decode(body: str, index: int) -> ToolCall | str:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"tool call {index}: not valid JSON ({exc.msg} at char {exc.pos}): {_short(body)}"
    except RecursionError:
        return _too_deep(index)
    return call_from_object(obj, index)


def _collect(found: list[ToolCall | str], content: str) -> ParsedReply:
    calls = tuple(item for item in found if isinstance(item, ToolCall))
    errors = tuple(item for item in found if isinstance(item, str))
    return ParsedReply(content=content.strip(), calls=calls, errors=errors)


def parse_hermes(text: str, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>") -> ParsedReply:
    found: list[ToolCall | str] = []
    content: list[str] = []
    position = 0
    while True:
        start = text.find(open_tag, position)
        if start < 0:
            content.append(text[position:])
            break
        content.append(text[position:start])
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            found.append(f"tool call {len(found) + 1}: {open_tag} is never closed by {close_tag}; "
                         f"write {open_tag}{{\"name\": ..., \"arguments\": {{...}}}}{close_tag}")
            break
        found.append(_decode(text[start + len(open_tag):end], len(found) + 1))
        position = end + len(close_tag)
    return _collect(found, "".join(content))


def parse_mistral(text: str, marker: str = "[TOOL_CALLS]") -> ParsedReply:
    head, sep, rest = text.partition(marker)
    if not sep:
        return ParsedReply(content=text.strip())
    found: list[ToolCall | str] = []
    trailing: list[str] = []
    for segment in rest.split(marker):
        segment = segment.strip()
        try:
            value, end = json.JSONDecoder().raw_decode(segment)
        except json.JSONDecodeError as exc:
            found.append(f"tool call {len(found) + 1}: {marker} must be followed by a JSON list of "
                         f"{{\"name\", \"arguments\"}} objects ({exc.msg}): {_short(segment)}")
            continue
        except RecursionError:
            found.append(_too_deep(len(found) + 1))
            continue
        for obj in value if isinstance(value, list) else [value]:
            found.append(call_from_object(obj, len(found) + 1))
        trailing.append(segment[end:])
    return _collect(found, head + "".join(trailing))


def parse_llama3_json(text: str, python_tag: str = "<|python_tag|>") -> ParsedReply:
    body = text.strip()
    if body.startswith(python_tag):
        body = body[len(python_tag):].strip()
    if not body.startswith("{"):
        return ParsedReply(content=text.strip())
    found: list[ToolCall | str] = []
    decoder = json.JSONDecoder()
    position = 0
    while position < len(body):
        try:
            value, position = decoder.raw_decode(body, position)
        except json.JSONDecodeError as exc:
            found.append(f"tool call {len(found) + 1}: not valid JSON ({exc.msg} at char {exc.pos}): "
                         f"{_short(body[position:])}")
            break
        except RecursionError:
            found.append(_too_deep(len(found) + 1))
            break
        found.append(call_from_object(value, len(found) + 1))
        while position < len(body) and body[position] in " \t\r\n;":
            position += 1
    return _collect(found, "")


PARSERS: dict[str, Parser] = {
    "hermes": parse_hermes,
    "qwen": parse_hermes,
    "mistral": parse_mistral,
    "llama3_json": parse_llama3_json,
}


def get_parser(name: str) -> Parser:
    """The parser registered as `name`, or ValueError listing the valid names."""
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(sorted(PARSERS))}") from None
