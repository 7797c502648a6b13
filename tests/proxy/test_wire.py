"""The chat-completions request parsing of the proxy, with and without the job's message cache."""

from __future__ import annotations

import json

import pytest

from orchestrator.proxy.chat_completions import parse_request
from orchestrator.proxy.chat_form import BadRequest, MessageForms

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def history(turns: int, last_output: str = "done") -> list[dict[str, object]]:
    messages: list[dict[str, object]] = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Go."}]
    for turn in range(turns):
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{turn}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"ls {turn}"})}}]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": last_output if turn == turns - 1 else f"out {turn}"}]
    return messages


def test_the_cache_gives_what_a_fresh_parse_gives_and_tells_changed_messages_apart() -> None:
    forms = MessageForms()
    for turns, output in ((1, "done"), (2, "done"), (2, "other"), (3, "done"), (1, "done")):
        body = {"model": "m", "messages": history(turns, output), "tools": TOOLS}
        cached, fresh = parse_request(body, forms=forms), parse_request(json.loads(json.dumps(body)))
        assert (cached.messages, cached.keys, cached.tools_key) == (fresh.messages, fresh.keys, fresh.tools_key)
    assert parse_request({"messages": history(2, "done")}, forms=forms).keys[-1] != \
        parse_request({"messages": history(2, "other")}, forms=forms).keys[-1]


def test_the_cache_is_bounded_and_bad_messages_are_still_refused() -> None:
    forms = MessageForms(limit=3)
    for turns in range(1, 6):
        parse_request({"messages": history(turns)}, forms=forms)
    assert len(forms._forms) <= 3
    with pytest.raises(BadRequest, match="each message needs a role"):
        parse_request({"messages": [{"role": "wizard", "content": "x"}]}, forms=forms)
    with pytest.raises(BadRequest, match="each message needs a role"):
        parse_request({"messages": ["just text"]}, forms=forms)


def test_a_resent_history_keeps_its_forms_and_an_edited_one_is_converted_again() -> None:
    """The items the last request sent (a byte prefix of this list) are reused, not converted
    again; after an earlier item changed or an exchange dropped, each item is looked up again,
    and every parse equals a fresh one."""
    forms = MessageForms()
    converted: list[str] = []
    original = forms.converted

    def counting(kind: str, raw: object, *args: object, **kwargs: object) -> object:
        converted.append(json.dumps(raw))
        return original(kind, raw, *args, **kwargs)   # type: ignore[arg-type]

    forms.converted = counting   # type: ignore[method-assign]
    longer = history(3, "out 2")          # history(2, "out 1") and one more exchange
    edited = [*longer[:1], {"role": "user", "content": "Go, but differently."}, *longer[2:]]
    for messages, fresh_items in ((history(2, "out 1"), 6), (longer, 2), (longer, 0), (edited, 8),
                                  (longer[:2] + longer[4:], 6)):
        converted.clear()
        body = {"model": "m", "messages": messages, "tools": TOOLS}
        cached, fresh = parse_request(body, forms=forms), parse_request(json.loads(json.dumps(body)))
        assert (cached.messages, cached.keys) == (fresh.messages, fresh.keys)
        assert len(converted) == fresh_items, converted


def test_responses_function_calls_that_join_the_last_message_are_grouped_as_a_fresh_parse() -> None:
    """A Responses input's last group may grow (function calls join the assistant message before
    them): it is not kept as settled, so the next request groups it as a fresh parse does."""
    from orchestrator.proxy.openai_responses import OpenAIResponses

    def body(items: list[dict[str, object]]) -> dict[str, object]:
        return {"model": "m", "input": items}

    said = [{"role": "user", "content": "Go."}, {"type": "message", "role": "assistant", "content": "Looking."}]
    called = [*said, {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    api = OpenAIResponses()
    for items in (said, called, called + [{"role": "user", "content": "More."}]):
        cached, fresh = api.parse(body(items)), OpenAIResponses().parse(json.loads(json.dumps(body(items))))
        assert (cached.messages, cached.keys) == (fresh.messages, fresh.keys)
    assert api.parse(body(called)).messages[1]["tool_calls"][0]["id"] == "c1"
