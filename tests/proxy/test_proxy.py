"""The per-job proxy in process, against a real scripted serve-llm (real tokenizer, real HTTP):
  * the official `openai` client (plain and streaming) gets tool calls back; every sampled id the
    proxy recorded is what the backend says it sampled; a call that extends the last keeps its
    ids verbatim (prefix_merging prompts are verbatim prefixes);
  * a harness that drops early messages yields several samples, each well formed;
  * only the job gets in: no token / a wrong token -> 401; from a real bubblewrap sandbox (no
    network) through the relay it answers, while another job's sandbox sees neither its socket
    nor gets in with its token.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.proxy.server import new_proxy_dir
from orchestrator.proxy.trajectory import Builder, build_samples
from tests.proxy.conftest import Backend, needs_bwrap
from tests.proxy.jobs import Job, assert_backend_sampled, assert_well_formed
from tests.proxy.scripts import BASH_TOOL

pytestmark = [pytest.mark.llm]


def openai_client(job: Job) -> Any:
    import openai

    transport = httpx.Client(transport=httpx.HTTPTransport(uds=job.socket), timeout=120)
    return openai.OpenAI(base_url="http://proxy/v1", api_key=job.token, http_client=transport, max_retries=0)


def test_openai_client_tool_calls_streaming_and_token_fidelity(job: Job, backend: Backend) -> None:
    client = openai_client(job)
    messages: list[Any] = [{"role": "system", "content": "You use tools."}, {"role": "user", "content": "Task fidelity."}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=BASH_TOOL)
    call = first.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("bash", {"command": "ls -la"})
    assert first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content == "Let me look."
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "notes.txt"}]
    # Streaming: the official client reassembles the tool call from the chunks.
    chunks = list(client.chat.completions.create(model="policy", messages=messages, tools=BASH_TOOL, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = [c.choices[0].delta for c in chunks if c.choices]
    calls = [t for d in streamed for t in d.tool_calls or ()]
    assert [json.loads(t.function.arguments) for t in calls] == [{"command": "cat notes.txt"}]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0].id, "type": "function", "function": {"name": "bash", "arguments": calls[0].function.arguments}}]}
    messages += [assistant, {"role": "tool", "tool_call_id": calls[0].id, "content": "the answer is 42"}]
    last = client.chat.completions.create(model="policy", messages=messages, tools=BASH_TOOL)
    assert last.choices[0].message.content == "The answer is 42." and last.choices[0].finish_reason == "stop"
    assert [m.id for m in client.models.list().data] == ["policy"]

    recorder = job.recorder
    assert recorder is not None
    assert [c["extended"] for c in recorder.calls] == [False, True, True] and len(recorder.chains) == 1
    assert {c["policy_version"] for c in recorder.calls} == {3}
    assert_backend_sampled(backend, recorder.calls)
    merged = build_samples(recorder.calls, Builder.PREFIX_MERGING)
    assert len(merged) == 1 and merged[0].calls == [0, 1, 2]
    assert_well_formed(merged, recorder.calls)
    # The merged sequence is the conversation buffer, id for id.
    conversation = recorder.chains[0].conversation
    assert merged[0].ids == conversation.input_ids and merged[0].response_mask == conversation.response_mask
    assert len(build_samples(recorder.calls, Builder.PER_REQUEST)) == 3


def test_history_rewrite_starts_a_new_sample(job: Job, backend: Backend) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You use tools."},
                                      {"role": "user", "content": "Task rewrite."}]
    with job.http(job.token) as http:
        def ask(history: list[dict[str, Any]]) -> dict[str, Any]:
            answer = http.post("/chat/completions", json={"model": "x", "messages": history, "tools": BASH_TOOL})
            assert answer.status_code == 200, answer.text
            return answer.json()["choices"][0]["message"]

        for step in range(4):
            if step == 2:   # the harness "summarises": it drops the first exchange
                messages = messages[:2] + messages[4:]
            reply = ask(messages)
            messages += [{**reply, "provider_specific_fields": {}},   # what litellm adds when echoing
                         {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": f"out {step}"}]
    recorder = job.recorder
    assert recorder is not None
    assert [c["extended"] for c in recorder.calls] == [False, True, False, True]
    assert_backend_sampled(backend, recorder.calls)
    merged = build_samples(recorder.calls, Builder.PREFIX_MERGING)
    assert [s.calls for s in merged] == [[0, 1], [2, 3]]
    assert_well_formed(merged, recorder.calls)
    assert_well_formed(build_samples(recorder.calls, Builder.PER_REQUEST), recorder.calls)


def test_concurrent_new_calls_record_the_chains_they_start(job: Job, backend: Backend) -> None:
    """Two calls that start chains while both are in flight: each record names its own chain."""
    import threading

    messages = [{"role": "system", "content": "You use tools."}, {"role": "user", "content": "Task rewrite."}]
    start = threading.Barrier(2)
    answers: list[int] = []

    def ask() -> None:
        with job.http(job.token) as http:
            start.wait(30)
            answers.append(http.post("/chat/completions", json={"model": "x", "messages": messages,
                                                                "tools": BASH_TOOL}).status_code)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    recorder = job.recorder
    assert recorder is not None and answers == [200, 200]
    assert [c["extended"] for c in recorder.calls] == [False, False] and len(recorder.chains) == 2
    assert sorted(c["chain"] for c in recorder.calls) == [0, 1]


def test_requests_without_the_jobs_token_are_refused(job: Job, backend: Backend) -> None:
    body = {"model": "x", "messages": [{"role": "user", "content": "Task sandbox."}]}
    with job.http() as anonymous, job.http("hr-not-the-token") as wrong, job.http(job.token) as right:
        assert anonymous.post("/chat/completions", json=body).status_code == 401
        assert wrong.post("/chat/completions", json=body).status_code == 401
        assert wrong.get("/models").status_code == 401
        assert right.get("/models").status_code == 200
        bad = right.post("/chat/completions", json={"messages": []})
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
    assert job.recorder is not None and job.recorder.calls == []


CLIENT = textwrap.dedent("""
    import json, os, sys, urllib.request, urllib.error
    url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
    key = sys.argv[1] if len(sys.argv) > 1 else os.environ["OPENAI_API_KEY"]
    body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "Task sandbox."}]}).encode()
    request = urllib.request.Request(url, body, {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        print("ANSWER", json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"])
    except urllib.error.HTTPError as exc:
        print("HTTP", exc.code)
""")


@needs_bwrap
def test_reachable_from_its_sandbox_only(backend: Backend, tmp_path: Path, spool: Any) -> None:
    from orchestrator.sandbox.start import start_sandbox

    inside = "/run/hpc-rollout-llm"
    (tmp_path / "client.py").write_text(CLIENT)

    async def scenario(a: Job, b: Job) -> None:
        boxes = [await start_sandbox("bwrap", job_id=j.job_id, paths=spool, network=False,
                                     binds=[f"{j.directory}:{inside}:ro", f"{tmp_path}:/client:ro"]) for j in (a, b)]
        try:
            relay = f"python3 -I {inside}/relay.py --dir {inside} -- python3 /client/client.py"
            own = await boxes[0].bash(relay, timeout=60)
            assert "ANSWER hello from the policy" in own.output, own.output
            # Job B's sandbox: A's socket path does not exist there, and A's token does not open B's proxy.
            probe = await boxes[1].bash(f"test -e {a.directory}/proxy.sock && echo VISIBLE || echo ABSENT", timeout=30)
            assert "ABSENT" in probe.output
            stolen = await boxes[1].bash(f"{relay} {a.token}", timeout=60)
            assert "HTTP 401" in stolen.output, stolen.output
            offline = await boxes[0].bash("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 3)\"",
                                          timeout=30)
            assert offline.exit_code != 0   # the sandbox has no network: the socket is the only way out
        finally:
            for box in boxes:
                await box.close()

    with Job(backend, new_proxy_dir(tmp_path / "pa"), "job-a") as a, \
            Job(backend, new_proxy_dir(tmp_path / "pb"), "job-b") as b:
        asyncio.run(scenario(a, b))
        assert a.recorder is not None and b.recorder is not None
        assert len(a.recorder.calls) == 1 and b.recorder.calls == []
