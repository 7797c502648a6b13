"""Tool-call parsers by name, tool schemas and argument checks, observation cutting (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.agent.calls import ToolCall
from orchestrator.agent.json_depth import MAX_NESTING
from orchestrator.agent.messages import assistant_message, cut_middle, tool_message, with_call_ids
from orchestrator.agent.parsers import PARSERS, get_parser
from orchestrator.agent.tools import BASH, STR_REPLACE_EDITOR, check_arguments, openai_tools, tool_specs


def call(name: str, **arguments: object) -> str:
    return json.dumps({"name": name, "arguments": arguments})


def test_hermes_finds_every_call_and_keeps_the_text_around_them() -> None:
    text = f"I will look.\n<tool_call>\n{call('bash', command='ls')}\n</tool_call>\nthen <tool_call>{call('think', thought='x')}</tool_call>"
    reply = get_parser("hermes")(text)
    assert [c.name for c in reply.calls] == ["bash", "think"]
    assert reply.calls[0].arguments == {"command": "ls"}
    assert reply.content == "I will look.\n\nthen" and reply.errors == ()
    assert get_parser("qwen") is get_parser("hermes")


@pytest.mark.parametrize("body,needle", [
    ("{not json}", "not valid JSON"),
    ('{"arguments": {}}', '"name" must be a non-empty string'),
    ('{"name": "bash", "arguments": [1]}', '"arguments" must be a JSON object'),
    ('{"name": "bash", "arguments": "{oops"}', "is a string but not JSON"),
    ('["bash"]', "expected a JSON object"),
])
def test_hermes_malformed_calls_become_errors_not_exceptions(body: str, needle: str) -> None:
    reply = get_parser("hermes")(f"x<tool_call>{body}</tool_call><tool_call>{call('bash', command='true')}</tool_call>")
    assert len(reply.errors) == 1 and needle in reply.errors[0]
    assert [c.name for c in reply.calls] == ["bash"]


def test_hermes_unclosed_call_and_string_arguments() -> None:
    reply = get_parser("hermes")('<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
                                 "<tool_call>{\"name\": \"bash\"")
    assert reply.calls == (ToolCall("bash", {"command": "ls"}),)
    assert "never closed" in reply.errors[0]


def test_mistral_and_llama3_json_families() -> None:
    mistral = get_parser("mistral")(f"Sure.[TOOL_CALLS][{call('bash', command='ls')}, {call('finish')}]")
    assert [c.name for c in mistral.calls] == ["bash", "finish"] and mistral.content == "Sure."
    assert "JSON list" in get_parser("mistral")("[TOOL_CALLS] nope").errors[0]
    llama = get_parser("llama3_json")('<|python_tag|>{"name": "python", "parameters": {"code": "1"}}; '
                                      '{"name": "submit", "parameters": {"answer": "2"}}')
    assert [(c.name, c.arguments) for c in llama.calls] == [("python", {"code": "1"}), ("submit", {"answer": "2"})]
    assert get_parser("llama3_json")("The answer is 4.").calls == ()
    assert get_parser("llama3_json")("{broken").errors


def test_unknown_parser_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="hermes, llama3_json, mistral, qwen"):
        get_parser("xml")
    assert set(PARSERS) >= {"hermes", "mistral", "llama3_json"}


def test_tool_schemas_and_argument_checks() -> None:
    schemas = openai_tools(tool_specs(["bash", "str_replace_editor", "submit"]))
    assert [s["function"]["name"] for s in schemas] == ["bash", "str_replace_editor", "submit"]
    assert schemas[1]["function"]["parameters"]["properties"]["command"]["enum"] == \
        ["view", "create", "str_replace", "insert", "undo_edit"]
    assert check_arguments(BASH, {"command": "ls"}) == []
    assert check_arguments(BASH, {}) == ["missing required argument 'command'"]
    assert "must be of type string" in check_arguments(BASH, {"command": 3})[0]
    assert "unknown argument 'cmd'" in check_arguments(BASH, {"command": "ls", "cmd": 1})[0]
    assert "must be one of view" in check_arguments(STR_REPLACE_EDITOR, {"command": "delete", "path": "a"})[0]
    with pytest.raises(ValueError, match="standard tools: bash"):
        tool_specs(["browser"])


def test_messages_carry_calls_in_the_openai_shape() -> None:
    calls = with_call_ids([ToolCall("bash", {"command": "ls"})], turn=3)
    message = assistant_message(get_parser("hermes")("hi"), calls)
    assert message["tool_calls"][0] == {"id": "call_3_0", "type": "function",
                                        "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    assert tool_message(calls[0], "a\nb") == {"role": "tool", "tool_call_id": "call_3_0", "name": "bash", "content": "a\nb"}


def test_cut_middle_keeps_head_and_tail() -> None:
    text = "HEAD" + "x" * 10_000 + "TAIL"
    cut, was_cut = cut_middle(text, 200)
    assert was_cut and cut.startswith("HEAD") and cut.endswith("TAIL") and "characters truncated" in cut
    assert len(cut) < 300
    assert cut_middle("short", 200) == ("short", False)


@pytest.mark.parametrize("parser,wrap", [
    ("hermes", lambda body: f"<tool_call>{body}</tool_call>"),
    ("mistral", lambda body: f"[TOOL_CALLS][{body}]"),
    ("llama3_json", lambda body: body),
])
@pytest.mark.parametrize("depth", [100, 5000])
def test_a_call_nested_past_the_limit_is_an_error_not_a_crash(parser: str, wrap: Any, depth: int) -> None:
    """A policy can write JSON deeper than Python's json (and the ticket's orjson) can take: the
    loop tells the model, it does not die of a RecursionError (issue 34)."""
    deep = "[" * depth + "]" * depth
    reply = get_parser(parser)(wrap('{"name": "bash", "arguments": {"command": ' + deep + "}}"))
    assert reply.calls == () and len(reply.errors) == 1, reply
    assert "nests" in reply.errors[0] and str(MAX_NESTING) in reply.errors[0], reply.errors
    as_string = get_parser("hermes")("<tool_call>" + json.dumps({"name": "bash", "arguments": '{"c": ' + deep + "}"})
                                     + "</tool_call>")
    assert as_string.calls == () and str(MAX_NESTING) in as_string.errors[0], as_string.errors
