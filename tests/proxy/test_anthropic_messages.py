"""The Anthropic Messages API of the per-job proxy, driven by the official `anthropic` client against
a real scripted serve-llm (real tokenizer, real HTTP):
  * tool use, plain and streamed: tool_use blocks come back with their input objects; the
    tool_result blocks sent back are rendered as the template's tool messages; every sampled id
    is the backend's; the three calls extend each other into one sample whose masked stretches
    hold the tool observations; count_tokens counts what the first call sent;
  * errors in the API's own shape: unsupported content, server tools, unknown fields, a wrong
    key, an endpoint the proxy does not serve (named in the recorder's `unserved`);
  * cancellation: a client that leaves while its call is generating gets nothing, the call is
    recorded as cancelled and in no sample, and its retry continues the conversation.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from orchestrator.proxy.server import new_proxy_dir
from orchestrator.proxy.trajectory import Builder, build_samples
from tests.proxy.conftest import Backend
from tests.proxy.jobs import Job, assert_backend_sampled, assert_observations_masked, assert_well_formed

pytestmark = [pytest.mark.llm]
anthropic = pytest.importorskip("anthropic", reason="pip install -e '.[test]' installs the anthropic client")
try:   # anthropic >= 2 takes clients of httpx2 (its fork of httpx), older ones of httpx
    import httpx2 as client_httpx
except ImportError:
    import httpx as client_httpx  # type: ignore[no-redef]

BASH = {"name": "bash", "description": "Run a command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def client(job: Job, key: str | None = None) -> Any:
    http = client_httpx.Client(transport=client_httpx.HTTPTransport(uds=job.socket), timeout=120)
    return anthropic.Anthropic(base_url="http://proxy", api_key=key or job.token, http_client=http, max_retries=0)


def async_client(job: Job) -> Any:
    http = client_httpx.AsyncClient(transport=client_httpx.AsyncHTTPTransport(uds=job.socket), timeout=120)
    return anthropic.AsyncAnthropic(base_url="http://proxy", api_key=job.token, http_client=http, max_retries=0)


def dumped(content: list[Any]) -> list[dict[str, Any]]:
    return [block.model_dump(exclude_none=True) for block in content]


def test_tool_use_plain_and_streamed_one_sample_with_masked_observations(job: Job, backend: Backend) -> None:
    api = client(job)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Task anthropic."}]
    first = api.messages.create(model="policy", max_tokens=256, system="You use tools.", messages=messages,
                                tools=[BASH])
    assert first.stop_reason == "tool_use" and first.role == "assistant"
    text, call = first.content
    assert (text.type, text.text) == ("text", "Let me look.")
    assert (call.type, call.name, call.input) == ("tool_use", "bash", {"command": "ls -la"})
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    messages += [{"role": "assistant", "content": dumped(first.content)},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "README.md notes.txt"}]}]
    # Streaming: the client assembles the tool_use block from input_json_delta events.
    with api.messages.stream(model="policy", max_tokens=256, system="You use tools.", messages=messages,
                             tools=[BASH]) as stream:
        kinds = [event.type for event in stream]
        second = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    (streamed,) = second.content
    assert (streamed.name, streamed.input, second.stop_reason) == ("bash", {"command": "cat notes.txt"}, "tool_use")
    messages += [{"role": "assistant", "content": dumped(second.content)},
                 {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": streamed.id, "content": [{"type": "text", "text": "answer: 42 (from notes)"}]},
                     {"type": "text", "text": "<system-reminder>be brief</system-reminder>"}]}]
    last = api.messages.create(model="policy", max_tokens=256, system="You use tools.", messages=messages, tools=[BASH])
    assert last.stop_reason == "end_turn" and [b.text for b in last.content] == ["The answer is 42."]

    recorder = job.recorder
    assert recorder is not None
    assert [c["extended"] for c in recorder.calls] == [False, True, True] and len(recorder.chains) == 1
    assert {c["api"] for c in recorder.calls} == {"anthropic_messages"}
    assert_backend_sampled(backend, recorder.calls)
    (merged,) = build_samples(recorder.calls, Builder.PREFIX_MERGING)
    assert merged.calls == [0, 1, 2]
    assert_well_formed([merged], recorder.calls)
    assert_observations_masked(merged, recorder.tokenizer, ["README.md notes.txt", "answer: 42 (from notes)", "be brief"])
    # The tool results are the template's tool messages; the text after them a user message.
    rendered = recorder.chains[0].conversation.messages
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "tool", "assistant", "tool", "user", "assistant"]
    # count_tokens: what the first call sent, counted by the same template and tokenizer.
    counted = api.messages.count_tokens(model="policy", system="You use tools.", messages=messages[:1], tools=[BASH])
    assert counted.input_tokens == len(recorder.calls[0]["input_ids"])
    assert len(recorder.calls) == 3   # counting is not a call


def test_errors_come_in_the_apis_shape(job: Job) -> None:
    api = client(job)
    user = [{"role": "user", "content": "Task anthropic."}]
    image = [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "iVBORw0KGgo="}}]}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        api.messages.create(model="policy", max_tokens=16, messages=image)
    assert refused.value.status_code == 400 and "'image' content is not served" in refused.value.message
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="server tool 'web_search_20250305'"):
        api.messages.create(model="policy", max_tokens=16, messages=user,
                            tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.BadRequestError, match="unsupported field.*container"):
        api.messages.create(model="policy", max_tokens=16, messages=user, extra_body={"container": "c1"})
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        api.messages.create(model="policy", max_tokens=16, messages=user, tools=[BASH],
                            tool_choice={"type": "tool", "name": "bash"})
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        api.messages.create(model="policy", max_tokens=16, messages=user,
                            thinking={"type": "enabled", "budget_tokens": 1024})
    with pytest.raises(anthropic.AuthenticationError) as denied:
        client(job, key="hr-not-the-token").messages.create(model="policy", max_tokens=16, messages=user)
    assert denied.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        api.messages.batches.list()
    assert missing.value.body == {"type": "error", "error": {
        "type": "not_found_error", "message": missing.value.body["error"]["message"]}}
    assert job.recorder is not None and job.recorder.calls == []
    assert job.recorder.unserved == ["GET /v1/messages/batches"]
    models = api.models.list()
    assert [m.id for m in models.data] == ["policy"]


def test_a_client_that_leaves_mid_call_is_recorded_cancelled_and_its_retry_continues(backend: Backend,
                                                                                     tmp_path: Path) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Task cancel anthropic."}]

    async def scenario(job: Job) -> list[Any]:
        api = async_client(job)
        call = asyncio.create_task(api.messages.create(model="policy", max_tokens=256, messages=messages, tools=[BASH]))
        await asyncio.sleep(0.3)          # the proxy holds the generation 1 s: the call is in flight
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(1.5)          # the held generation ends; the proxy finds the client gone
        first = await api.messages.create(model="policy", max_tokens=256, messages=messages, tools=[BASH])
        # A stream the client leaves after its first event: the proxy has answered whole already.
        follow = [*messages, {"role": "assistant", "content": dumped(first.content)},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[-1].id,
                                                "content": "notes.txt"}]}]
        async with api.messages.stream(model="policy", max_tokens=256, messages=follow, tools=[BASH]) as stream:
            async for event in stream:
                assert event.type == "message_start"
                break
        await api.close()
        return [first]

    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-cancel", delay=1.0) as job:
        (first,) = asyncio.run(scenario(job))
        recorder = job.recorder
        assert recorder is not None
        assert [c.get("cancelled", False) for c in recorder.calls] == [True, False, False]
        assert [c["extended"] for c in recorder.calls[1:]] == [False, True] and len(recorder.chains) == 1
        assert first.content[-1].input == {"command": "ls -la"}
        assert_backend_sampled(backend, recorder.calls)
        samples = build_samples(recorder.calls, Builder.PREFIX_MERGING)
        assert [s.calls for s in samples] == [[1, 2]]
        assert_well_formed(samples, recorder.calls)
