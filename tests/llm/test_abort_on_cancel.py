"""A generation whose caller gives up stops on the server: the client side of a cancelled job.

Real parts: serve-llm --tiny (its own process) and the clients the workers use. vLLM's protocol
aborts a request whose client disconnected (stock vLLM's `with_cancellation`, checked live in
tests/vllm/test_time_limit.py); serve-llm now does the same, and SGLang's protocol also aborts by
the request's own `rid` (/abort_request), which SGLang needs since it notices a disconnected
non-streaming client only when its wait for output times out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.llm.client import RetryPolicy
from orchestrator.llm.http import BackendHttp
from orchestrator.llm.protocol_clients import client_for
from orchestrator.llm.registry import Backend, Protocol

pytestmark = pytest.mark.llm
BUDGET = 2000                       # seconds of sampling on this CPU: only an abort ends it early
LONG = {"max_tokens": BUDGET, "ignore_eos": True}
STOPPED_WITHIN_S = 2.0              # the row leaves at the model's next step (milliseconds)


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    started = start_server(threads=1)
    try:
        yield started
    finally:
        started.stop()


def running(server: LocalServer) -> int:
    page = httpx.get(server.url.removesuffix("/v1") + "/metrics", timeout=10).text
    return int(sum(float(line.split()[-1]) for line in page.splitlines() if line.startswith("vllm:num_requests_running")))


async def wait_running(server: LocalServer, count: int) -> None:
    deadline = time.monotonic() + 60
    while await asyncio.to_thread(running, server) < count:
        assert time.monotonic() < deadline, "the generation never started"
        await asyncio.sleep(0.05)


async def seconds_until_idle(server: LocalServer, limit_s: float) -> float:
    began = time.monotonic()
    while await asyncio.to_thread(running, server) and time.monotonic() - began < limit_s:
        await asyncio.sleep(0.05)
    return time.monotonic() - began


@pytest.mark.parametrize("protocol", [Protocol.VLLM, Protocol.SGLANG])
def test_a_cancelled_generation_stops_on_the_server(server: LocalServer, protocol: Protocol) -> None:
    async def scenario() -> tuple[float, float]:
        async with BackendHttp() as http:
            client = client_for(Backend(url=server.url, protocol=protocol), http, RetryPolicy(timeout_s=120))
            task = asyncio.create_task(client.generate([1, 2, 3], LONG))
            await wait_running(server, 1)
            await asyncio.sleep(0.3)
            cancelled_at = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            returned_s = time.monotonic() - cancelled_at
            return returned_s, await seconds_until_idle(server, 10.0)

    returned_s, idle_after_s = asyncio.run(scenario())
    assert returned_s < 2.5                     # the caller is let go at once (an SGLang abort: 2 s at most)
    assert idle_after_s < STOPPED_WITHIN_S, f"still generating {idle_after_s:.1f} s after the cancel"


def test_sglangs_abort_by_rid_ends_that_generation_with_what_it_sampled(server: LocalServer) -> None:
    async def scenario() -> Any:
        async with BackendHttp() as http:
            client = client_for(Backend(url=server.url, protocol=Protocol.SGLANG), http, RetryPolicy(timeout_s=120))
            info = await client.model_info()
            path, body = client.build_request(info.model_id, [1, 2, 3], BUDGET, {"ignore_eos": True})
            other_path, other = client.build_request(info.model_id, [4, 5], BUDGET, {"ignore_eos": True})
            answer = asyncio.create_task(client.request("POST", path, body))
            neighbour = asyncio.create_task(client.request("POST", other_path, other))
            await wait_running(server, 2)
            await asyncio.sleep(0.3)
            await client.abort_request(body)       # this one only: its rid
            completion = client.parse_response(await answer)
            still = await asyncio.to_thread(running, server)
            await client.abort_request(other)
            await neighbour
            return completion, still, body["rid"] != other["rid"]

    completion, still_running, own_rids = asyncio.run(scenario())
    assert own_rids                             # every request its own rid
    assert completion.finish_reason == "abort" and 0 < len(completion.output_ids) < BUDGET
    assert len(completion.logprobs) == len(completion.output_ids)
    assert still_running == 1                   # the neighbour went on

