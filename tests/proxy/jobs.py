"""One job's proxy in the test process, against the session's scripted serve-llm, and the checks
every proxy test makes of its records: each sampled id is the backend's, each sample is made of
verbatim prefixes."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.agent.parsers import get_parser
from orchestrator.llm.router import router_for
from orchestrator.llm.session import LLMSession
from orchestrator.proxy.recorder import CallRecorder, ProxyLimits
from orchestrator.proxy.server import JobProxy, read_token
from orchestrator.proxy.trajectory import samples_of
from tests.proxy.conftest import Backend


class Held:
    """The job's LLM session with each generation held back `delay` seconds first: a window in
    which a test's client can leave while its call is in flight. The generation itself is the
    real backend's."""

    def __init__(self, llm: LLMSession, delay: float) -> None:
        self.llm, self.delay = llm, delay

    async def tokenizer(self) -> Any:
        return await self.llm.tokenizer()

    async def generate(self, prompt: list[int], sampling: dict[str, Any]) -> Any:
        await asyncio.sleep(self.delay)
        return await self.llm.generate(prompt, sampling)


class Job:
    """One job's proxy on its own directory, served from a thread's event loop."""

    def __init__(self, backend: Backend, directory: Path, job_id: str, *, delay: float = 0.0,
                 limits: ProxyLimits | None = None, max_body_bytes: int | None = None, max_tokens: int = 256) -> None:
        self.backend, self.directory, self.job_id = backend, directory, job_id
        self.max_tokens = max_tokens
        self.delay = delay
        self.limits = limits or ProxyLimits(max_calls=20, max_context_tokens=30000)
        self.max_body_bytes = max_body_bytes
        self.loop = asyncio.new_event_loop()
        self.recorder: CallRecorder | None = None
        self.proxy: JobProxy | None = None

    def __enter__(self) -> "Job":
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.call(self._start())
        return self

    def __exit__(self, *_: object) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(120)

    async def _start(self) -> None:
        router = router_for(self.backend.paths, f"worker-{self.job_id}")
        self.llm = LLMSession(router, job_id=self.job_id)
        llm: Any = Held(self.llm, self.delay) if self.delay else self.llm
        self.recorder = CallRecorder(llm, await self.llm.tokenizer(), get_parser("hermes"),
                                     {"max_tokens": self.max_tokens}, self.limits)
        extra = {"max_body_bytes": self.max_body_bytes} if self.max_body_bytes else {}
        self.proxy = JobProxy(self.recorder, self.directory, **extra)
        await self.proxy.start()

    async def _stop(self) -> None:
        assert self.proxy is not None
        await self.proxy.close()
        await self.llm.close()
        await self.llm.router.close()   # this job's own router (router_for, keyed by the job)

    @property
    def token(self) -> str:
        return read_token(self.directory)

    @property
    def socket(self) -> str:
        return str(self.directory / "proxy.sock")

    def http(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(transport=httpx.HTTPTransport(uds=self.socket), base_url="http://proxy/v1",
                            headers=headers, timeout=120)


def assert_backend_sampled(backend: Backend, calls: list[dict[str, Any]]) -> None:
    """Every call's ids are the backend's record of that generation, id for id."""
    records = {tuple(r["prompt_ids"]): r for r in backend.records()}
    for call in calls:
        record = records[tuple(call["input_ids"])]
        assert call["output_ids"] == record["output_ids"]
        assert call["logprobs"] == pytest.approx(record["logprobs"])


def assert_well_formed(samples: list[Any], calls: list[dict[str, Any]]) -> None:
    """Each call of a sample: its input is a verbatim prefix of the sample, its output follows with mask 1."""
    for sample in samples:
        ids = sample.ids
        mask = [0] * len(sample.prompt_ids) + sample.response_mask
        assert len(sample.response_ids) == len(sample.response_mask) == len(sample.logprobs)
        for index in sample.calls:
            inputs, outputs = calls[index]["input_ids"], calls[index]["output_ids"]
            assert ids[:len(inputs)] == inputs
            assert ids[len(inputs):len(inputs) + len(outputs)] == outputs
            assert set(mask[len(inputs):len(inputs) + len(outputs)]) == {1}
        assert sum(sample.response_mask) == sum(len(calls[i]["output_ids"]) for i in sample.calls)


def assert_observations_masked(sample: Any, tokenizer: Any, observations: list[str]) -> None:
    """The ids between the sample's sampled stretches (mask 0) hold the tool observations: each
    observation's text appears in the decoded masked stretches and nowhere in the sampled ones."""
    ids, mask = sample.response_ids, sample.response_mask
    masked = tokenizer.decode([i for i, m in zip(ids, mask) if m == 0])
    sampled = tokenizer.decode([i for i, m in zip(ids, mask) if m == 1])
    for text in observations:
        assert text in masked and text not in sampled, (text, masked[:400])


def check_fidelity(row: dict[str, Any], served: list[dict[str, Any]]) -> None:
    """Every recorded call's output is what the backend served for its exact prompt ids, and the samples are well formed."""
    calls = [dict(t) for t in row["turns"]]
    by_prompt = {tuple(r["prompt_ids"]): r for r in served}
    for call in calls:
        assert by_prompt[tuple(call["input_ids"])]["output_ids"] == call["output_ids"]
    assert_well_formed(samples_of(row), calls)
