"""Swapping the policy's weights: every backend reloads a checkpoint, then the version moves.

    report = swap_weights(paths, "ckpt/12", version=12)      # or `backend swap DIR --reload CKPT`

Each `up` or `draining` backend of the registry is asked, concurrently, to load CKPT (vLLM:
/collective_rpc reload_weights; SGLang: /update_weights_from_disk; serve-llm speaks both).
Only when every one has confirmed does backends.json say version N, in one atomic write, so a
turn recorded with version N was sampled with N's weights. When one fails, nothing moves and
ReloadFailed names who failed (those that did reload serve N labelled N-1 until a retry: their
samples look older, never newer, than they are). Backends that are `down` cannot confirm: they
are removed from the registry (probed back up they would serve the old weights as N); restart
them on the checkpoint and add them again. Servers without a reload route: see docs/llm.md.

With `abort=True` (partial rollouts, docs/trainer.md) each backend is first asked to abort the
generations in flight (vLLM dev mode /abort_requests, SGLang and serve-llm /abort_request): they
answer at once with what they sampled on the old weights, and their sessions resume them as new
requests once the version has moved (orchestrator/llm/session.py), so a long reply does not hold
the reload up nor finish on weights the trainer has left behind. A server without the route is
named in the report and reloads as it would have.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.llm.client import RetryPolicy
from orchestrator.llm.http import BackendHttp
from orchestrator.llm.protocol_clients import client_for
from orchestrator.llm.errors import AbortUnsupported, LLMError
from orchestrator.llm.registry import Backend, BackendRegistry, BackendState
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.staleness import staleness_floor

log = logging.getLogger(__name__)
RELOAD_RETRY = RetryPolicy(attempts=2, backoff_s=0.5, timeout_s=600.0)


class ReloadFailed(LLMError):
    """At least one backend did not confirm the reload; the policy version did not move."""


@dataclass(frozen=True)
class SwapReport:
    version: int
    checkpoint: str
    reloaded: tuple[str, ...]
    removed: tuple[str, ...] = ()
    seconds: float = 0.0
    per_backend_s: dict[str, float] = field(default_factory=dict)
    aborted: dict[str, int | None] = field(default_factory=dict)   # generations aborted per backend (None: not told)
    abort_unsupported: tuple[str, ...] = ()                          # backends without an abort route


def swap_weights(paths: SpoolPaths, checkpoint: str | Path, version: int, max_policy_lag: int | None = None,
                 abort: bool = False) -> SwapReport:
    """Reload `checkpoint` on every registered backend, then move the policy version to `version`.

    `max_policy_lag` (>= 0) also sets the oldest policy still trained on to version - lag;
    `abort` first aborts the generations in flight (they resume on the new weights).
    """
    return asyncio.run(swap_weights_async(paths, checkpoint, version, max_policy_lag, abort))


async def swap_weights_async(paths: SpoolPaths, checkpoint: str | Path, version: int,
                             max_policy_lag: int | None = None, abort: bool = False) -> SwapReport:
    started = time.monotonic()
    directory = str(Path(checkpoint).absolute())
    if not Path(directory).is_dir():
        raise ReloadFailed(f"checkpoint {directory} is not a directory: save the model there first")
    registry = BackendRegistry(paths)
    snapshot = registry.read()
    targets = [b for b in snapshot.backends if b.state is not BackendState.DOWN]
    down = tuple(b.url for b in snapshot.backends if b.state is BackendState.DOWN)
    if not targets:
        raise ReloadFailed(f"no backend to reload in {paths.backends}: add one with `hpc-rollout backend add`")
    async with BackendHttp() as http:
        outcomes = await asyncio.gather(*(_reload_one(http, b, directory, version, abort) for b in targets))
    failed = [f"{o.url}: {o.problem}" for o in outcomes if o.problem]
    if failed:
        raise ReloadFailed(
            f"{len(failed)} of {len(targets)} backend(s) did not load {directory}; policy version stays "
            f"{snapshot.policy_version}: " + "; ".join(failed)
        )
    floor = staleness_floor(version, max_policy_lag)
    registry.set_versions([b.url for b in targets], version, floor, drop=down)
    return SwapReport(version, directory, tuple(b.url for b in targets), down, time.monotonic() - started,
                      {o.url: o.seconds for o in outcomes},
                      {o.url: o.aborted for o in outcomes if o.abort_supported},
                      tuple(o.url for o in outcomes if abort and not o.abort_supported))


@dataclass(frozen=True)
class _Outcome:
    url: str
    seconds: float
    problem: str = ""
    aborted: int | None = None
    abort_supported: bool = True


async def _reload_one(http: BackendHttp, backend: Backend, directory: str, version: int,
                      abort: bool) -> _Outcome:
    started = time.monotonic()
    client = client_for(backend, http, RELOAD_RETRY)
    aborted, supported = None, abort
    if abort:
        try:
            aborted = await client.abort_all()
        except AbortUnsupported as exc:
            supported = False
            log.info("%s", exc)
        except LLMError as exc:   # the reload below says whether the server is usable
            supported = False
            log.warning("abort on %s failed: %s", backend.url, exc)
    try:
        await client.reload(directory, version)
    except LLMError as exc:
        return _Outcome(backend.url, time.monotonic() - started, str(exc), aborted, supported)
    return _Outcome(backend.url, time.monotonic() - started, "", aborted, supported)
