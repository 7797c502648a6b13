"""Token-in/token-out clients: the shared request loop, retries and result type.

Protocol details live in vllm.py and sglang.py; `clients.client_for(backend)` picks one.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator.llm.http import BackendHttp, HttpFailure
from orchestrator.llm.errors import AbortUnsupported, BackendFailed, ReloadUnsupported, RequestRejected
from orchestrator.llm.registry import Backend
from orchestrator.llm.urls import endpoint

log = logging.getLogger(__name__)

# Sampling keys every client understands; anything else in the job's sampling dict is
# passed through to the server untouched (seed, top_k, min_p, stop_token_ids, ...).
MAX_TOKENS_KEYS = ("max_tokens", "max_new_tokens")
DEFAULT_MAX_TOKENS = 256
NO_ANSWER = "no answer within"   # how a timed-out request is described (and recognised when probing)
HEALTH_DEADLINE_S = 5.0
ABORT_DEADLINE_S = 2.0   # a cancelled generation's explicit abort: asked once, this long at most


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3            # total tries on one backend before it counts as failed
    backoff_s: float = 0.25      # doubled after each failure
    max_backoff_s: float = 4.0
    timeout_s: float = 300.0     # one request, generation included: a total deadline, not per read
    connect_timeout_s: float = 5.0


@dataclass(frozen=True)
class Completion:
    """One sampled continuation, ids and logprobs aligned one to one."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str                  # stop | length | abort
    logprob_mode: str                   # raw | processed (after temperature): the backend's served_logprobs
    weight_version: str | None = None   # what the server reports, when it does


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    max_model_len: int | None


@dataclass
class ModelInfoCache:
    """What each registry entry serves, asked once per worker rather than once per task: on a busy
    server GET /v1/models before a task's first turn took 60 ms (benchmarks.backends). An entry
    added again (a restarted server) or whose state changed (down, back up) is asked again."""

    capacity: int = 256
    _known: dict[tuple[Any, ...], ModelInfo] = field(default_factory=dict, repr=False)

    @staticmethod
    def entry(backend: Backend) -> tuple[Any, ...]:
        return (backend.url, backend.protocol, backend.model, backend.added_at, backend.state_changed_at)

    def get(self, backend: Backend) -> ModelInfo | None:
        return self._known.get(self.entry(backend))

    def put(self, backend: Backend, info: ModelInfo) -> None:
        if len(self._known) >= self.capacity:  # entries of servers long gone: drop the oldest
            del self._known[next(iter(self._known))]
        self._known[self.entry(backend)] = info


@dataclass
class BackendClient(abc.ABC):
    backend: Backend
    http: BackendHttp
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    known: ModelInfoCache | None = None     # shared by the tasks of one worker
    _info: ModelInfo | None = field(default=None, repr=False)

    @abc.abstractmethod
    def build_request(self, model: str, prompt_ids: list[int], max_tokens: int,
                      sampling: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) of a generate request."""

    @abc.abstractmethod
    def parse_response(self, body: Any) -> Completion:
        """The completion in a generate response, or BackendFailed naming what is missing."""

    async def model_info(self) -> ModelInfo:
        """Model id (registry's, else the first of /v1/models) and the context length."""
        if self._info is None and self.known is not None:
            self._info = self.known.get(self.backend)
        if self._info is None:
            data: dict[str, Any] = {}
            try:
                data = await self.request("GET", "/v1/models")
            except RequestRejected:
                pass  # an SGLang server without the OpenAI layer; model id must be registered
            models = data.get("data") or [{}]
            model_id = self.backend.model or models[0].get("id")
            if not model_id:
                raise BackendFailed(self.backend.url, "/v1/models lists no model: register one with --model")
            max_len = models[0].get("max_model_len")
            self._info = ModelInfo(model_id, int(max_len) if max_len else None)
            if self.known is not None:
                self.known.put(self.backend, self._info)
        return self._info

    async def generate(self, prompt_ids: list[int], sampling: dict[str, Any]) -> Completion:
        info = await self.model_info()
        params = {k: v for k, v in sampling.items() if k not in MAX_TOKENS_KEYS}
        wanted = next((int(sampling[k]) for k in MAX_TOKENS_KEYS if k in sampling), DEFAULT_MAX_TOKENS)
        room = wanted if info.max_model_len is None else min(wanted, info.max_model_len - len(prompt_ids))
        if room <= 0:  # the context is full: nothing can be sampled, the conversation ends
            return Completion([], [], "length", self.backend.served_logprobs.value)
        path, body = self.build_request(info.model_id, list(prompt_ids), room, params)
        try:
            answer = await self.request("POST", path, body)
        except asyncio.CancelledError:
            # The caller gave up (its job was cancelled): the transport closed the connection, which
            # aborts the request on vLLM at once; a server that notices a disconnect late is told.
            await self.abort_request(body)
            raise
        return self.parse_response(answer)

    async def abort_request(self, body: dict[str, Any]) -> None:
        """Abort the generation `body` asked for, its caller gone. vLLM aborts a request whose
        client disconnected (its `with_cancellation` routes), so the closed connection is enough;
        a protocol whose server notices that late overrides this (sglang.py)."""

    @abc.abstractmethod
    async def reload(self, checkpoint: str, version: int) -> None:
        """Ask the server to load the weights in `checkpoint` (a directory it can read) now."""

    @abc.abstractmethod
    async def abort_all(self) -> int | None:
        """Ask the server to abort every generation in flight now: each answers with what it has
        sampled so far and finish reason `abort` (the session resumes it). How many were aborted
        (None: the server does not say); AbortUnsupported when the server has no such route."""

    def abort_unsupported(self, exc: Exception) -> "AbortUnsupported":
        return AbortUnsupported(
            f"backend {self.backend.url} cannot abort generations ({exc}); for vLLM start it with "
            f"VLLM_SERVER_DEV_MODE=1 (/abort_requests); SGLang and serve-llm have /abort_request"
        )

    def reload_unsupported(self, exc: Exception) -> "ReloadUnsupported":
        return ReloadUnsupported(
            f"backend {self.backend.url} cannot reload weights while running ({exc}); for vLLM start it "
            f"with VLLM_SERVER_DEV_MODE=1, else restart it on the checkpoint through the vllm sbatch "
            f"template and re-add it (docs/llm.md, 'Weight reload')"
        )

    async def health(self) -> bool:
        try:
            response = await self.http.get(endpoint(self.backend.url, "/health"), timeout_s=HEALTH_DEADLINE_S)
        except (HttpFailure, TimeoutError):
            return False
        return response.status == 200

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """JSON response of one call, retried with backoff on transient failures."""
        url = endpoint(self.backend.url, path)
        delay = self.retry.backoff_s
        problem = ""
        for attempt in range(1, self.retry.attempts + 1):
            try:
                # The deadline is for the whole exchange, not one read: a server sending a byte a
                # second must still trip it.
                response = await self.http.request(method, url, body, timeout_s=self.retry.timeout_s,
                                                   connect_timeout_s=self.retry.connect_timeout_s)
            except TimeoutError as exc:
                # A server that takes this long is hung, overloaded or trickling: asking it again
                # only makes the task wait longer. The backend is marked down by the session.
                raise BackendFailed(self.backend.url, f"{NO_ANSWER} {self.retry.timeout_s:g} s "
                                                      f"({type(exc).__name__}, request deadline)") from None
            except HttpFailure as exc:
                problem = str(exc)
            else:
                if response.status < 400:
                    if not response.content:   # e.g. SGLang's /abort_request: 200, no body
                        return None
                    try:
                        return response.json()
                    except ValueError:
                        problem = f"{path} answered non-JSON: {response.text[:200]!r}"
                elif response.status in (408, 429) or response.status >= 500:
                    problem = f"{path} answered HTTP {response.status}: {response.text[:200]}"
                else:
                    raise RequestRejected(
                        f"backend {self.backend.url} rejected {path} with HTTP "
                        f"{response.status}: {response.text[:500]}"
                    )
            if attempt < self.retry.attempts:
                log.info("backend %s attempt %d failed (%s); retry in %.2fs", self.backend.url,
                         attempt, problem, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry.max_backoff_s)
        raise BackendFailed(self.backend.url, f"{problem} (after {self.retry.attempts} attempts)")


def require(condition: bool, url: str, message: str | Callable[[], str]) -> None:
    """BackendFailed with `message` unless `condition`. A message that quotes the answer is given
    as a function: it runs only on failure (rendering a whole answer costs as much as parsing it)."""
    if not condition:
        raise BackendFailed(url, message if isinstance(message, str) else message())
