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
