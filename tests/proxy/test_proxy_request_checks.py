"""What a harness sends is checked before anything reads it deeply (issue 34, item 5):
  * JSON nested past the proxy's limit (a tool's schema, a tool call's arguments, a history
    block, metadata, a body past the JSON parser's own limit) is refused with 400 in the API's
    own shape, naming the limit, on every endpoint; nothing reaches the backend and the proxy
    serves the next call. (Before: a 500-deep input_schema gave count_tokens aiohttp's plain-text
    500, the other endpoints a 500 "Recursion limit reached"; Responses' metadata a plain-text 500
    after the call was generated; arguments strings a 500 RecursionError.)
  * a policy's reply whose tool call nests past the limit is answered as its text (a malformed
    call), and the conversation goes on. (Before: 500 on every API at 1100 levels, a plain-text
    500 on Messages at 300.)
  * a typed field of the wrong type (`"stream": "yes"`, `"temperature": "0.5"`, ...) or outside
    the API's range is refused with 400 naming the field and the allowed values. (Before:
    answered as if valid; `"temperature": "hot"` on Messages reached the backend, whose 400 ended
    the job as a backend failure (503); `"n": "x"` and a list as previous_response_id gave 500s.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.proxy.recorder import ProxyLimits
from orchestrator.proxy.server import new_proxy_dir
from tests.proxy.conftest import Backend
from tests.proxy.jobs import Job
from tests.proxy.scripts import BASH_TOOL, DEEP_REPLIES

pytestmark = [pytest.mark.llm]
MAX_NESTING = 64   # levels of JSON a request may nest (docs/proxy.md, "Budgets")
ANTHROPIC = {"anthropic-version": "2023-06-01"}
ASK = "Task sandbox."


def deep_schema(levels: int) -> dict[str, Any]:
    """A JSON schema `levels` levels of JSON deep (objects in objects, as nested parameters are)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range((levels - 1) // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def deep_list(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


DEEP = deep_schema(500)
DEEP_ARGUMENTS = "[" * 5000 + "]" * 5000   # a tool call's arguments as a JSON string
USER = [{"role": "user", "content": ASK}]

# (endpoint, headers, body): every place a request can nest
CASES: dict[str, tuple[str, dict[str, str], dict[str, Any] | str]] = {
    "messages: tool input_schema": ("/messages", ANTHROPIC, {
        "model": "x", "max_tokens": 32, "messages": USER, "tools": [{"name": "deep", "input_schema": DEEP}]}),
    "count_tokens: tool input_schema": ("/messages/count_tokens", ANTHROPIC, {
        "model": "x", "messages": USER, "tools": [{"name": "deep", "input_schema": DEEP}]}),
    "chat: tool parameters": ("/chat/completions", {}, {
        "model": "x", "messages": USER,
        "tools": [{"type": "function", "function": {"name": "deep", "parameters": DEEP}}]}),
    "responses: tool parameters": ("/responses", {}, {
        "model": "x", "input": ASK, "tools": [{"type": "function", "name": "deep", "parameters": DEEP}]}),
    "messages: tool_use input in the history": ("/messages", ANTHROPIC, {
        "model": "x", "max_tokens": 32, "messages": [
            *USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": DEEP}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}),
    "chat: tool call arguments (a JSON string)": ("/chat/completions", {}, {
        "model": "x", "messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": DEEP_ARGUMENTS}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}),
    "responses: function_call arguments (a JSON string)": ("/responses", {}, {
        "model": "x", "input": [{"role": "user", "content": ASK},
                                {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": DEEP_ARGUMENTS},
                                {"type": "function_call_output", "call_id": "c1", "output": "ok"}]}),
    "responses: metadata (echoed in the answer)": ("/responses", {}, {
        "model": "x", "input": ASK, "metadata": {"deep": deep_list(500)}}),
    # deeper than Python's json can write: the body is given as text
    "messages: a body deeper than the JSON parser's own limit": ("/messages", ANTHROPIC, json.dumps({
        "model": "x", "max_tokens": 32, "messages": USER, "metadata": {"deep": "DEEP"}}).replace(
        '"DEEP"', "[" * 2000 + "]" * 2000)),
}


def shown(answer: httpx.Response) -> str:
    return f"{answer.status_code} {answer.headers.get('content-type')} {answer.text[:300]}"


def error_message(answer: httpx.Response) -> str:
    body = answer.json()
    return str(body["error"]["message"])


@pytest.mark.parametrize("case", list(CASES))
def test_json_nested_past_the_limit_is_a_400_naming_it(job: Job, backend: Backend, case: str) -> None:
    path, headers, body = CASES[case]
    generated_before = len(backend.records())
    with job.http(job.token) as http:
        content = body if isinstance(body, str) else json.dumps(body)
        answer = http.post(path, content=content, headers={**headers, "Content-Type": "application/json"})
        assert answer.status_code == 400, shown(answer)
        assert answer.headers["content-type"].startswith("application/json")
        message = error_message(answer)
        assert f"at most {MAX_NESTING} levels" in message, message
        if headers:
            assert answer.json()["type"] == "error" and answer.json()["error"]["type"] == "invalid_request_error"
        else:
            assert answer.json()["error"]["type"] == "invalid_request_error"
        assert job.recorder is not None and job.recorder.calls == []
        assert len(backend.records()) == generated_before   # nothing reached the backend
        fine = http.post("/chat/completions", json={"model": "x", "messages": USER})
        assert fine.status_code == 200, fine.text


def test_json_nested_within_the_limit_is_served(job: Job) -> None:
    schema = deep_schema(MAX_NESTING - 6)   # body > tools > tool > function > parameters: 5 levels above it
    tools = [{"type": "function", "function": {"name": "deep", "parameters": schema}}]
    with job.http(job.token) as http:
        answer = http.post("/chat/completions", json={"model": "x", "messages": USER, "tools": tools})
        assert answer.status_code == 200, answer.text


CHAT, MESSAGES, RESPONSES = "/chat/completions", "/messages", "/responses"
BASE = {CHAT: {"model": "x", "messages": USER}, MESSAGES: {"model": "x", "max_tokens": 32, "messages": USER},
        RESPONSES: {"model": "x", "input": ASK}}
# (endpoint, field, value, what the refusal must name as allowed)
WRONG = [
    (CHAT, "stream", "yes", "true or false"), (MESSAGES, "stream", "yes", "true or false"),
    (RESPONSES, "stream", "yes", "true or false"), (CHAT, "stream", 1, "true or false"),
    (CHAT, "temperature", "0.5", "a number from 0 to 2"), (MESSAGES, "temperature", "hot", "a number from 0 to 1"),
    (RESPONSES, "temperature", "0.5", "a number from 0 to 2"), (CHAT, "temperature", -1, "a number from 0 to 2"),
    (MESSAGES, "temperature", 1.5, "a number from 0 to 1"), (RESPONSES, "top_p", 2, "a number from 0 to 1"),
    (CHAT, "top_p", "1", "a number from 0 to 1"), (MESSAGES, "top_k", 1.5, "an integer"),
    (CHAT, "seed", "7", "an integer"), (CHAT, "presence_penalty", "x", "a number from -2 to 2"),
    (CHAT, "n", "x", "1"), (CHAT, "stop", 5, "a string or a list of strings"),
    (CHAT, "stream_options", "yes", "a JSON object"), (CHAT, "parallel_tool_calls", "yes", "true or false"),
    (CHAT, "model", 5, "a string"), (MESSAGES, "model", ["x"], "a string"),
    (MESSAGES, "metadata", "x", "a JSON object"), (RESPONSES, "store", "yes", "true or false"),
    (RESPONSES, "parallel_tool_calls", "no", "true or false"), (RESPONSES, "previous_response_id", ["x"], "a string"),
    (RESPONSES, "metadata", "x", "a JSON object"),
]


@pytest.mark.parametrize("path,name,value,allowed", WRONG, ids=[f"{p[1:]}-{n}={v!r}" for p, n, v, _ in WRONG])
def test_a_typed_field_of_the_wrong_type_is_a_400_naming_it(job: Job, backend: Backend, path: str, name: str,
                                                             value: Any, allowed: str) -> None:
    generated_before = len(backend.records())
    headers = ANTHROPIC if path == MESSAGES else {}
    with job.http(job.token) as http:
        answer = http.post(path, json={**BASE[path], name: value}, headers=headers)
        assert answer.status_code == 400, f"{answer.status_code} {answer.text[:300]}"
        message = error_message(answer)
        assert message.startswith(f"{name} must be {allowed}") and repr(value) in message, message
        if path != MESSAGES:
            assert answer.json()["error"]["param"] == name
    assert job.recorder is not None and job.recorder.calls == []
    assert len(backend.records()) == generated_before


def test_stream_stream_options_and_nulls_of_the_right_type_are_served(job: Job) -> None:
    with job.http(job.token) as http:
        plain = http.post(CHAT, json={**BASE[CHAT], "stream": False, "temperature": None, "seed": 7, "stop": ["\n\n"],
                                      "top_p": 1, "parallel_tool_calls": True})
        assert plain.status_code == 200, plain.text
        streamed = http.post(CHAT, json={**BASE[CHAT], "stream": True, "stream_options": {"include_usage": True}})
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
        anthropic = http.post(MESSAGES, headers=ANTHROPIC, json={**BASE[MESSAGES], "temperature": 1, "top_k": 5,
                                                                  "metadata": {"user_id": "u"}})
        assert anthropic.status_code == 200, anthropic.text
        responses = http.post(RESPONSES, json={**BASE[RESPONSES], "store": False, "temperature": 0.7,
                                               "metadata": {"k": "v"}})
        assert responses.status_code == 200, responses.text


REPLY_ASK = {   # each API's request, with a tool so the reply's calls are parsed
    CHAT: ({"model": "x", "max_tokens": 4096, "tools": BASH_TOOL}, "messages"),
    MESSAGES: ({"model": "x", "max_tokens": 4096, "tools": [
        {"name": "bash", "input_schema": BASH_TOOL[0]["function"]["parameters"]}]}, "messages"),
    RESPONSES: ({"model": "x", "max_output_tokens": 4096, "tools": [
        {"type": "function", "name": "bash", "parameters": BASH_TOOL[0]["function"]["parameters"]}]}, "input"),
}


def reply_text(path: str, answer: dict[str, Any]) -> tuple[str, int]:
    """The answer's text and how many tool calls it carries."""
    if path == CHAT:
        message = answer["choices"][0]["message"]
        return message["content"] or "", len(message.get("tool_calls") or ())
    if path == MESSAGES:
        blocks = answer["content"]
        return "".join(b.get("text", "") for b in blocks), sum(b["type"] == "tool_use" for b in blocks)
    items = answer["output"]
    return ("".join(part["text"] for item in items if item["type"] == "message" for part in item["content"]),
            sum(item["type"] == "function_call" for item in items))


@pytest.mark.parametrize("levels", DEEP_REPLIES)
@pytest.mark.parametrize("path", [CHAT, MESSAGES, RESPONSES])
def test_a_policy_tool_call_nested_past_the_limit_is_answered_as_its_text(backend: Backend, tmp_path: Path,
                                                                         path: str, levels: int) -> None:
    limits = ProxyLimits(max_calls=5, max_context_tokens=30000, max_tokens_per_call=4096)
    base, field = REPLY_ASK[path]
    ask = f"Task deep reply {levels}."
    body = {**base, field: [{"role": "user", "content": ask}]}
    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-deep-reply", limits=limits, max_tokens=4096) as job, \
            job.http(job.token) as http:
        answer = http.post(path, json=body, headers=ANTHROPIC if path == MESSAGES else {})
        assert answer.status_code == 200, shown(answer)
        text, calls = reply_text(path, answer.json())
        assert calls == 0 and text.startswith("<tool_call>") and "[" * levels in text
        recorder = job.recorder
        assert recorder is not None and len(recorder.calls) == 1 and recorder.malformed_calls == 1
        # the harness's next call, with the reply in its history, continues the conversation
        history = {CHAT: [{"role": "assistant", "content": text}],
                   MESSAGES: [{"role": "assistant", "content": text}],
                   RESPONSES: [{"role": "assistant", "content": text}]}[path]
        follow = {**base, field: [{"role": "user", "content": ask}, *history, {"role": "user", "content": "Again."}]}
        again = http.post(path, json=follow, headers=ANTHROPIC if path == MESSAGES else {})
        assert again.status_code == 200, again.text[:300]
        assert [c["extended"] for c in recorder.calls] == [False, True]


def test_the_peer_is_checked_once_per_connection_and_a_stranger_is_refused(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer's uid is read once per connection (it is fixed when the peer connects), so
    keep-alive requests do not ask the kernel again, and a peer of another uid is refused with
    403 in the API's shape."""
    import asyncio
    import os

    from orchestrator.proxy import server
    from orchestrator.proxy.recorder import CallRecorder

    asked: list[int] = []
    stranger = {"on": False}

    def counted(request: object) -> int:
        asked.append(1)
        return os.getuid() + 1 if stranger["on"] else os.getuid()

    monkeypatch.setattr(server, "peer_uid", counted)

    async def scenario() -> list[int]:
        directory = server.new_proxy_dir(tmp_path / "px")
        proxy = server.JobProxy(CallRecorder(None, None, lambda text: None), directory)   # type: ignore[arg-type]
        headers = {"Authorization": f"Bearer {proxy.token}"}
        statuses = []
        async with proxy:
            transport = httpx.AsyncHTTPTransport(uds=str(directory / server.SOCKET_NAME))
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
                for _ in range(3):
                    statuses.append((await http.get("/v1/models", headers=headers)).status_code)
            stranger["on"] = True
            transport = httpx.AsyncHTTPTransport(uds=str(directory / server.SOCKET_NAME))
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
                refused = await http.get("/v1/models", headers=headers)
                statuses.append(refused.status_code)
                assert refused.json()["error"]["type"] == "permission_error"
        return statuses

    assert asyncio.run(scenario()) == [200, 200, 200, 403]
    assert len(asked) == 2   # one per connection
