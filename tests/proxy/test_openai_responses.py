"""The OpenAI Responses API of the per-job proxy, driven by the official `openai` client against a real
scripted serve-llm (real tokenizer, real HTTP):
  * tool use, plain and streamed: function_call items come back; the output items sent back with
    function_call_output items continue the conversation (and so does previous_response_id with
    only the new items); every sampled id is the backend's; the calls merge into one sample whose
    masked stretches hold the tool observations; a reply cut by max_output_tokens is `incomplete`;
  * errors in the API's own shape: images, hosted tools, unknown fields, a forced tool_choice,
    an unknown previous response, a wrong key, an endpoint the proxy does not serve;
  * cancellation: a client that leaves while its call is generating gets nothing, the call is
    recorded as cancelled and in no sample, and its retry continues the conversation.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.proxy.server import new_proxy_dir
from orchestrator.proxy.trajectory import Builder, build_samples
from tests.proxy.conftest import Backend
from tests.proxy.jobs import Job, assert_backend_sampled, assert_observations_masked, assert_well_formed

pytestmark = [pytest.mark.llm]
openai = pytest.importorskip("openai")

BASH = {"type": "function", "name": "bash", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def client(job: Job, key: str | None = None) -> Any:
    http = httpx.Client(transport=httpx.HTTPTransport(uds=job.socket), timeout=120)
    return openai.OpenAI(base_url="http://proxy/v1", api_key=key or job.token, http_client=http, max_retries=0)


def async_client(job: Job) -> Any:
    http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=job.socket), timeout=120)
    return openai.AsyncOpenAI(base_url="http://proxy/v1", api_key=job.token, http_client=http, max_retries=0)


def items(response: Any) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_none=True) for item in response.output]


def test_tool_use_plain_streamed_and_by_previous_response(job: Job, backend: Backend) -> None:
    api = client(job)
    conversation: list[dict[str, Any]] = [{"role": "developer", "content": "Work in the repository."},
                                          {"role": "user", "content": [{"type": "input_text", "text": "Task responses."}]}]
    first = api.responses.create(model="policy", instructions="You use tools.", input=conversation, tools=[BASH])
    assert first.status == "completed" and [i.type for i in first.output] == ["message", "function_call"]
    assert first.output_text == "Let me look."
    call = first.output[1]
    assert (call.name, call.arguments) == ("bash", '{"command": "ls -la"}')
    assert first.usage is not None and first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    conversation += [*items(first), {"type": "function_call_output", "call_id": call.call_id,
                                     "output": "README.md notes.txt"}]
    # Streaming: the client assembles the response from the typed events.
    with api.responses.stream(model="policy", instructions="You use tools.", input=conversation, tools=[BASH]) as stream:
        kinds = [event.type for event in stream]
        second = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    (streamed,) = second.output
    assert (streamed.type, streamed.name, streamed.arguments) == ("function_call", "bash", '{"command": "cat notes.txt"}')
    # The next call names the previous response and sends only what is new.
    last = api.responses.create(model="policy", instructions="You use tools.", previous_response_id=second.id,
                                input=[{"type": "function_call_output", "call_id": streamed.call_id,
                                        "output": "answer: 42 (from notes)"}], tools=[BASH])
    assert last.output_text == "The answer is 42." and last.status == "completed"

    recorder = job.recorder
    assert recorder is not None
    assert [c["extended"] for c in recorder.calls] == [False, True, True] and len(recorder.chains) == 1
    assert {c["api"] for c in recorder.calls} == {"openai_responses"}
    assert_backend_sampled(backend, recorder.calls)
    (merged,) = build_samples(recorder.calls, Builder.PREFIX_MERGING)
    assert merged.calls == [0, 1, 2]
    assert_well_formed([merged], recorder.calls)
    assert_observations_masked(merged, recorder.tokenizer, ["README.md notes.txt", "answer: 42 (from notes)"])
    rendered = recorder.chains[0].conversation.messages
    assert [m["role"] for m in rendered] == ["system", "developer", "user", "assistant", "tool", "assistant", "tool",
                                             "assistant"]


def test_a_cut_reply_is_incomplete(job: Job) -> None:
    cut = client(job).responses.create(model="policy", input="Task long.", max_output_tokens=5)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert job.recorder is not None and len(job.recorder.calls[0]["output_ids"]) == 5


def test_errors_come_in_the_apis_shape(job: Job) -> None:
    api = client(job)
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]
    with pytest.raises(openai.BadRequestError) as refused:
        api.responses.create(model="policy", input=image)
    assert refused.value.status_code == 400 and "'input_image' content is not served" in refused.value.message
    assert refused.value.body["type"] == "invalid_request_error" and refused.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError, match="'web_search' tools"):
        api.responses.create(model="policy", input="Task responses.", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="unsupported field.*conversation"):
        api.responses.create(model="policy", input="Task responses.", conversation="conv_1")
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        api.responses.create(model="policy", input="Task responses.", tools=[BASH], tool_choice="required")
    with pytest.raises(openai.NotFoundError) as unknown:
        api.responses.create(model="policy", input="Task responses.", previous_response_id="resp_nope")
    assert unknown.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.AuthenticationError):
        client(job, key="hr-not-the-token").responses.create(model="policy", input="Task responses.")
    with pytest.raises(openai.NotFoundError) as missing:
        api.responses.retrieve("resp_123")
    assert missing.value.body["type"] == "not_found_error"
    assert job.recorder is not None and job.recorder.calls == []
    assert job.recorder.unserved == ["GET /v1/responses/resp_123"]


def test_a_client_that_leaves_mid_call_is_recorded_cancelled_and_its_retry_continues(backend: Backend,
                                                                                     tmp_path: Path) -> None:
    request: dict[str, Any] = {"model": "policy", "input": "Task cancel responses.", "tools": [BASH]}

    async def scenario(job: Job) -> Any:
        api = async_client(job)
        call = asyncio.create_task(api.responses.create(**request, stream=True))
        await asyncio.sleep(0.3)          # the proxy holds the generation 1 s: the call is in flight
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(1.5)          # the held generation ends; the proxy finds the client gone
        first = await api.responses.create(**request)
        follow = {**request, "input": [{"role": "user", "content": "Task cancel responses."}, *items(first),
                                       {"type": "function_call_output", "call_id": first.output[-1].call_id,
                                        "output": "README.md notes.txt"}]}
        second = await api.responses.create(**follow)
        await api.close()
        return second

    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-cancel", delay=1.0) as job:
        second = asyncio.run(scenario(job))
        assert second.output[-1].arguments == '{"command": "cat notes.txt"}'
        recorder = job.recorder
        assert recorder is not None
        assert [c.get("cancelled", False) for c in recorder.calls] == [True, False, False]
        assert [c["extended"] for c in recorder.calls[1:]] == [False, True] and len(recorder.chains) == 1
        assert_backend_sampled(backend, recorder.calls)
        samples = build_samples(recorder.calls, Builder.PREFIX_MERGING)
        assert [s.calls for s in samples] == [[1, 2]]
        assert_well_formed(samples, recorder.calls)
