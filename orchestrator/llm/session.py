"""One task's LLM session: a sticky backend, failover, and a record of every turn.

    async with session_for(ctx) as llm:
        tokenizer = await llm.tokenizer()
        turn = await llm.generate(prompt_ids, ctx.job.sampling)

The backend is picked once per task (least in flight cluster-wide) and every turn goes
to it, so its prefix cache is reused. When it fails, it is marked down for everyone, the
task moves to another backend for this and later turns, and the switch is recorded as a
job event and in the turn. When none is left, the task waits for one to come back (an outage
of the only backend costs time, not the task) for up to the router's outage_wait_s in all,
counted from the first failure since the last answer; then it fails, naming the last cause. Each turn records the backend and the policy version the
registry gives that backend at request time (a swap shows up from the next turn on). A backend
marked `draining` (a rolling weight swap reloads it next) gets no further turn: the task moves
to an `up` backend at its next turn (an `llm_backend_moved` event), unless none is usable.

Staleness (orchestrator/spool/staleness.py): a `restart` job raises StalePolicy before a turn
once an earlier turn's policy is older than the registry's floor; a `continue` job goes on, the
turn re-prefilling the whole conversation on the new weights (one `policy_continued` event).
A generation the server aborts (a weight swap with abort, docs/llm.md) comes back with what it
sampled so far; the session waits for the registry to show the backend's new version and resumes
it as a new request (the prompt plus the partial reply, the rest of the token budget), so one
reply may be made of several requests: `Turn.parts`, one record each (`Turn.records()`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.config import Staleness
from orchestrator.llm.client import DEFAULT_MAX_TOKENS, MAX_TOKENS_KEYS, BackendClient, RetryPolicy
from orchestrator.llm.protocol_clients import client_for
from orchestrator.llm.errors import BackendFailed, LLMError, NoBackendAvailable
from orchestrator.llm.identity import RECHECK_S, tokenizer_hash
from orchestrator.llm.registry import Backend, BackendState
from orchestrator.llm.router import Router, router_for
from orchestrator.llm.tokenizer import load_tokenizer
from orchestrator.spool.staleness import StalePolicy, stale_reason

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext

log = logging.getLogger(__name__)

DEFAULT_MAX_SWITCHES = 3
ABORTED = "abort"            # the finish reason of a generation the server aborted (vLLM, SGLang, serve-llm)
RESUME_WAIT_S = 60.0         # an aborted generation waits this long for its backend's new version
RESUME_POLL_S = 0.25         # how often it looks
MAX_RESUMES = 16             # aborted parts of one reply before it is returned as it is


@dataclass(frozen=True)
class Turn:
    input_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    backend: str
    policy_version: int
    finish_reason: str
    logprob_mode: str
    switched_from: str | None = None   # the backend that failed during this turn, if any
    sent_at: float = 0.0               # unix time the registry was read for this turn
    latency_s: float = 0.0             # request sent to answer parsed, on the backend that answered
    model: str | None = None           # the model id the backend serves
    tokenizer_hash: str | None = None  # orchestrator.llm.identity of the tokenizer directory, when local
    # A reply the server aborted and the session resumed: one Turn per request, in order. The
    # Turn itself is then their concatenation (input of the first, every output, the oldest version).
    parts: tuple["Turn", ...] = ()

    def to_json(self, *, copy: bool = True) -> dict[str, Any]:
        """The turn as a record; `copy=False` hands over its own lists (for a caller that drops
        the turn: a long prompt's copy costs ~30 us per 8,000 ids)."""
        # Not asdict(): it deep-copies every id one by one (2 ms for a 600-token prompt, per turn).
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "parts"}
        return {name: list(v) if isinstance(v, list) else v for name, v in record.items()} if copy else record

    def records(self) -> list[dict[str, Any]]:
        """One record per request the backend received (its exact input ids): what a row's `turns` hold."""
        return [part.to_json() for part in self.parts] if self.parts else [self.to_json()]


def joined(parts: list[Turn]) -> Turn:
    """The reply made of the requests in `parts` (an aborted one resumed by the next)."""
    if len(parts) == 1:
        return parts[0]
    last = parts[-1]
    return Turn(
        input_ids=parts[0].input_ids, output_ids=[i for p in parts for i in p.output_ids],
        logprobs=[x for p in parts for x in p.logprobs], backend=last.backend,
        policy_version=min(p.policy_version for p in parts),   # look older, never newer
        finish_reason=last.finish_reason, logprob_mode=last.logprob_mode,
        switched_from=next((p.switched_from for p in parts if p.switched_from), None), sent_at=parts[0].sent_at,
        latency_s=round(sum(p.latency_s for p in parts), 6), model=last.model, tokenizer_hash=last.tokenizer_hash,
        parts=tuple(parts),
    )


@dataclass
class LLMSession:
    router: Router
    job_id: str = ""
    event: Callable[..., None] = lambda name, **fields: None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_switches: int = DEFAULT_MAX_SWITCHES
    backend: Backend | None = None
    failed: list[str] = field(default_factory=list)
    oldest_version: int | None = None   # the oldest policy version a turn of this task used
    staleness: Staleness = Staleness.RESTART   # what a turn does once oldest_version is below the floor
    resume_wait_s: float = RESUME_WAIT_S
    # router_for's router, shared by the sessions outside a worker: counted in at session_for,
    # out at close (the last one out closes the connections). A worker closes its own at its stop.
    outside_worker: bool = False
    _counted_out: bool = field(default=False, repr=False)
    _continued_at: int = field(default=0, repr=False)     # the floor last reported as continued past
    _switched_from: str | None = field(default=None, repr=False)  # reported by the next turn
    _trouble_since: float | None = field(default=None, repr=False)  # first failure since the last answer
    _last_failure: str = field(default="", repr=False)
    _clients: dict[str, BackendClient] = field(default_factory=dict, repr=False)

    async def __aenter__(self) -> "LLMSession":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the task's in-flight slot (its connections stay with the worker's pool). Safe to call twice."""
        if self.backend is not None:
            self.router.release(self.backend.url)
            self.backend = None
        if self.outside_worker and not self._counted_out:
            self._counted_out = True
            await self.router.session_ended()

    # -- the backend ------------------------------------------------------------------------
    async def ensure_backend(self) -> Backend:
        if self.backend is None:
            try:
                self.backend = await self.router.acquire(exclude=self.failed, wait_s=self._wait_left())
            except NoBackendAvailable as exc:
                cause = f"; last failure: {self._last_failure}" if self._last_failure else ""
                raise NoBackendAvailable(f"task {self.job_id}: {exc}{cause}") from None
            self.event("llm_backend", backend=self.backend.url, node=self.backend.node,
                       policy_version=self.backend.policy_version)
        # Re-read the entry: a swap may have given this URL a new policy version. A removed
        # entry keeps serving this task (it finishes undisturbed) with its last known version.
        current = self.router.current(self.backend.url)
        if current is not None:
            self.backend = current
            if current.state is BackendState.DRAINING:
                await self._leave_draining(current)
        return self.backend

    async def _leave_draining(self, draining: Backend) -> None:
        """The task's backend is draining (a rolling weight swap is about to reload it, or it was
        drained by hand): the next turn goes to an `up` backend, without waiting and without
        counting as a failure. With none usable, the task stays where it is."""
        try:
            moved = await self.router.acquire(exclude=[*self.failed, draining.url], wait_s=0)
        except LLMError:
            return
        self.router.release(draining.url)
        self.backend = moved
        self.event("llm_backend_moved", backend=moved.url, node=moved.node, policy_version=moved.policy_version,
                   from_backend=draining.url, reason="draining")

    def client(self, backend: Backend) -> BackendClient:
        existing = self._clients.get(backend.url)
        if existing is None or (existing.backend.protocol, existing.backend.model) != (backend.protocol, backend.model):
            existing = client_for(backend, self.router.connections.client(), self.retry, self.router.model_infos)
            self._clients[backend.url] = existing
        return existing

    async def tokenizer(self) -> Any:
        """The policy's tokenizer, loaded offline from the registry's tokenizer/model path."""
        while True:
            backend = await self.ensure_backend()
            path = backend.tokenizer or backend.model
            if path is not None:
                break
            try:
                path = (await self.client(backend).model_info()).model_id
                break
            except BackendFailed as exc:  # dead before the first turn: move on like a turn would
                self._switch(backend, str(exc))
        resolved = tokenizer_directory(path)
        if resolved is None:
            raise LLMError(
                f"backend {backend.url} serves model {path!r}, which is not a local directory: "
                f"register its tokenizer with `hpc-rollout backend add ... --tokenizer DIR`"
            )
        loaded = _loaded_tokenizers.get(resolved)
        if loaded is not None:   # every task after the first: no hop to a thread and back
            return loaded
        # Loading parses tokenizer.json (and imports transformers once): keep the loop responsive.
        return await asyncio.to_thread(cached_tokenizer, resolved)

    # -- generation ---------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: dict[str, Any] | None = None) -> Turn:
        """Sample one reply on the task's backend, moving to another one if it fails.

        Raises StalePolicy when an earlier turn of this `restart` task used a policy the trainer
        no longer accepts (orchestrator/spool/staleness.py): the job can only end stale. A
        generation the server aborts is resumed (module docstring): the Turn then has `parts`.
        """
        prompt, params = list(prompt_ids), dict(sampling or {})
        parts: list[Turn] = []
        while True:
            part = await self._generate_once(prompt, params)
            parts.append(part)
            if part.finish_reason != ABORTED or len(parts) > MAX_RESUMES:
                break
            left = _token_budget(params) - len(part.output_ids)
            self.event("llm_aborted", backend=part.backend, sampled=len(part.output_ids),
                       policy_version=part.policy_version)
            if left <= 0:   # aborted as the budget ran out: the reply is complete as cut
                parts[-1] = replace(part, finish_reason="length")
                break
            await self._await_new_version(part.backend, part.policy_version)
            prompt, params = prompt + part.output_ids, {**_without_budget(params), "max_tokens": left}
        return joined(parts)

    async def _await_new_version(self, url: str, version: int) -> None:
        """Wait (up to resume_wait_s) until the registry gives `url` another version than `version`:
        an abort comes with a weight swap, whose new version is written once every backend reloaded."""
        deadline = time.monotonic() + self.resume_wait_s
        while time.monotonic() < deadline:
            # One stat of backends.json per look (none on runs of > 16 workers, where the cluster
            # summary vouches for the registry), only while a swap is under way.
            entry = self.router.current(url)
            if entry is None or entry.policy_version != version or entry.state is BackendState.DRAINING:
                return   # (draining: a rolling swap reloads it; the reply resumes on an up backend)
            await asyncio.sleep(RESUME_POLL_S)
        log.info("task %s: %s still at version %d %.0f s after an abort; resuming there", self.job_id, url,
                 version, self.resume_wait_s)

    async def _generate_once(self, prompt_ids: list[int], sampling: dict[str, Any]) -> Turn:
        while True:
            sent_at = time.time()
            backend = await self.ensure_backend()
            self._check_staleness()
            client = self.client(backend)
            requested = time.monotonic()
            try:
                completion = await client.generate(prompt_ids, dict(sampling or {}))
                model = (await client.model_info()).model_id  # cached by generate()
            except BackendFailed as exc:
                self._switch(backend, str(exc))
                continue
            latency_s = time.monotonic() - requested
            self.router.note_healthy(backend.url)
            self._trouble_since = None
            if self.oldest_version is None or backend.policy_version < self.oldest_version:
                self.oldest_version = backend.policy_version
            switched_from, self._switched_from = self._switched_from, None
            return Turn(
                input_ids=list(prompt_ids), output_ids=completion.output_ids,
                logprobs=completion.logprobs, backend=backend.url,
                policy_version=backend.policy_version, finish_reason=completion.finish_reason,
                logprob_mode=completion.logprob_mode, switched_from=switched_from, sent_at=sent_at,
                latency_s=round(latency_s, 6), model=model,
                tokenizer_hash=tokenizer_hash(backend.tokenizer or backend.model or model),
            )

    def _check_staleness(self) -> None:
        floor = self.router.min_policy_version()
        reason = stale_reason(self.oldest_version, floor)
        if reason is None:
            return
        if self.staleness is Staleness.RESTART:
            raise StalePolicy(f"task {self.job_id}: {reason}")
        if floor > self._continued_at:   # a partial rollout: the next turn re-prefills on the new weights
            self._continued_at = floor
            self.event("policy_continued", oldest_version=self.oldest_version, min_policy_version=floor)

    def _switch(self, backend: Backend, reason: str) -> None:
        self.router.mark_down(backend.url, reason)
        self.router.release(backend.url)
        self.backend = None
        self.failed.append(backend.url)
        self._switched_from = backend.url
        self._last_failure = reason
        if self._trouble_since is None:
            self._trouble_since = time.monotonic()
        self.event("llm_backend_failed", backend=backend.url, reason=reason[:500])
        distinct = list(dict.fromkeys(self.failed))
        out_of_time = self.router.outage_wait_s > 0 and self._wait_left() <= 0  # failing all along
        if len(distinct) > self.max_switches or out_of_time:
            raise NoBackendAvailable(
                f"task {self.job_id}: {len(distinct)} backend(s) failed ({', '.join(distinct)}) "
                f"over {time.monotonic() - self._trouble_since:.0f} s; last error: {reason}"
            )

    def _wait_left(self) -> float:
        """Seconds this task may still wait for a backend (outage_wait_s from the first failure)."""
        if self._trouble_since is None:
            return self.router.outage_wait_s
        return self.router.outage_wait_s - (time.monotonic() - self._trouble_since)


_tokenizer_lock = threading.Lock()
TOKENIZERS_KEPT = 8   # a run whose backends name a new checkpoint directory per version must not keep them all
_loaded_tokenizers: dict[str, Any] = {}   # resolved path -> tokenizer, the last TOKENIZERS_KEPT loaded (read without the lock)


_directories: dict[str, tuple[float, str]] = {}   # path -> (when resolved, monotonic; its real path)


def tokenizer_directory(path: str) -> str | None:
    """The real path of tokenizer directory `path` (None: not a directory), resolved again at most
    every RECHECK_S: every job asks, and a symlink re-pointed to a new checkpoint is followed then."""
    now = time.monotonic()
    seen = _directories.get(path)
    if seen is not None and now - seen[0] < RECHECK_S:
        return seen[1]
    directory = Path(path)
    if not directory.is_dir():
        return None
    if len(_directories) >= TOKENIZERS_KEPT * 8:
        _directories.clear()
    _directories[path] = (now, str(directory.resolve()))
    return _directories[path][1]


def cached_tokenizer(path: str) -> Any:
    # transformers' lazy imports are not thread-safe: load one tokenizer at a time.
    with _tokenizer_lock:
        tokenizer = _loaded_tokenizers.get(path)
        if tokenizer is None:
            tokenizer = _loaded_tokenizers[path] = load_tokenizer(path)
            while len(_loaded_tokenizers) > TOKENIZERS_KEPT:
                del _loaded_tokenizers[next(iter(_loaded_tokenizers))]
        return tokenizer


def _token_budget(sampling: dict[str, Any]) -> int:
    return next((int(sampling[k]) for k in MAX_TOKENS_KEYS if k in sampling), DEFAULT_MAX_TOKENS)


def _without_budget(sampling: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sampling.items() if k not in MAX_TOKENS_KEYS}


def session_for(ctx: "JobContext", *, retry: RetryPolicy | None = None,
                max_switches: int = DEFAULT_MAX_SWITCHES) -> LLMSession:
    """The LLM session of the job in `ctx`; use it as `async with` so its slot is released."""
    router = ctx.services.llm_router   # a worker injects the one it built from its RunConfig
    outside_worker = router is None
    if router is None:
        router = router_for(ctx.paths, ctx.worker_id, ctx.node)
        router.session_started()
    return LLMSession(router, job_id=ctx.job.job_id, event=ctx.event, outside_worker=outside_worker,
                      retry=retry or RetryPolicy(timeout_s=router.request_timeout_s), max_switches=max_switches,
                      staleness=Staleness.parse(ctx.job.staleness))
