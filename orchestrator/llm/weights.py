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

Rolling (`rolling=True`, `backend swap --reload CKPT --rolling`): the backends reload in waves
so that at least `min_serving` of those `up` (0.5 by default, never fewer than one) keep serving.
A wave is first marked `draining` (routers give it no new task, and a task on it moves to an `up`
backend at its next turn: orchestrator/llm/session.py), then reloads, then is recorded at the new
version and `up` again in one write; the registry's version (and min_policy_version = version -
max_policy_lag) moves with the first wave, and new tasks go to the backends at the newest
version first (orchestrator/llm/router.py). Backends waiting for their wave serve the previous
version meanwhile, so a rolling swap is refused (RollingRefused, nothing changed) when those
samples would be beyond the lag bound: max_policy_lag 0, or a jump of more versions than the lag.
A backend that fails its reload is marked `down` with the reason, later waves do not start, and
ReloadFailed says which backends are at which version; none is left `draining`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
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


DEFAULT_MIN_SERVING = 0.5   # a rolling swap keeps at least this share of the up backends serving


class ReloadFailed(LLMError):
    """At least one backend did not confirm the reload. All at once: the policy version did not
    move. Rolling: `versions` says which version each backend serves now (failed ones are down)."""

    def __init__(self, message: str, versions: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.versions = dict(versions or {})


class RollingRefused(ReloadFailed):
    """A rolling swap could not keep its promises (the lag bound, a backend serving): nothing changed."""


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
    waves: tuple[tuple[str, ...], ...] = ()                          # rolling: the backends of each wave, in order


def swap_weights(paths: SpoolPaths, checkpoint: str | Path, version: int, max_policy_lag: int | None = None,
                 abort: bool = False, rolling: bool = False, min_serving: float = DEFAULT_MIN_SERVING) -> SwapReport:
    """Reload `checkpoint` on every registered backend, then move the policy version to `version`.

    `max_policy_lag` (>= 0) also sets the oldest policy still trained on to version - lag;
    `abort` first aborts the generations in flight (they resume on the new weights). `rolling`
    reloads in waves keeping at least `min_serving` of the up backends serving (module docstring).
    """
    return asyncio.run(swap_weights_async(paths, checkpoint, version, max_policy_lag, abort, rolling, min_serving))


async def swap_weights_async(paths: SpoolPaths, checkpoint: str | Path, version: int,
                             max_policy_lag: int | None = None, abort: bool = False, rolling: bool = False,
                             min_serving: float = DEFAULT_MIN_SERVING) -> SwapReport:
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
    if rolling:
        waves = plan_waves(targets, min_serving)
        check_rolling_lag(targets, version, max_policy_lag)
        return await _rolling(registry, waves, down, directory, version, max_policy_lag, abort, started)
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


# -- rolling ----------------------------------------------------------------------------------------
def plan_waves(targets: Sequence[Backend], min_serving: float = DEFAULT_MIN_SERVING) -> list[tuple[Backend, ...]]:
    """The waves of a rolling reload of `targets` (up or draining backends), in order: at least
    max(1, ceil(min_serving x up)) of the up ones serve at every moment. Backends already draining
    serve nothing: they go with the first wave. RollingRefused when no such plan exists."""
    if not 0 <= min_serving < 1:
        raise RollingRefused(f"min_serving {min_serving!r} must be in [0, 1) (the share of backends that keep "
                             f"serving while the others reload): e.g. {DEFAULT_MIN_SERVING}")
    up = [b for b in targets if b.state is BackendState.UP]
    drained = [b for b in targets if b.state is not BackendState.UP]
    if len(up) < 2:
        raise RollingRefused(
            f"a rolling swap needs at least 2 backends up (one serves while another reloads); {len(up)} "
            f"{'is' if len(up) == 1 else 'are'} up: add one with `hpc-rollout backend add`, or swap all at "
            f"once (rolling=False; `backend swap --reload` without --rolling)")
    keep = max(1, math.ceil(min_serving * len(up)))
    size = len(up) - keep
    if size < 1:
        raise RollingRefused(
            f"min_serving {min_serving} keeps all {len(up)} up backends serving: none could reload; lower "
            f"min_serving (at most {(len(up) - 1) / len(up):.2f} here) or add backends")
    waves = [tuple(up[i:i + size]) for i in range(0, len(up), size)]
    waves[0] = tuple(drained) + waves[0]
    return waves


def check_rolling_lag(targets: Sequence[Backend], version: int, max_policy_lag: int | None) -> None:
    """RollingRefused when a backend waiting for its wave would serve a version older than the
    staleness floor: its samples would be stale as they are taken (max_policy_lag 0, or a jump of
    more versions than the lag)."""
    floor = staleness_floor(version, max_policy_lag)
    if floor is None:
        return
    behind = [b for b in targets if b.policy_version < floor]
    if not behind:
        return
    oldest = min(b.policy_version for b in behind)
    raise RollingRefused(
        f"a rolling swap to version {version} with max_policy_lag {max_policy_lag} is refused: "
        f"{len(behind)} backend(s) serve version {oldest} until their wave reloads, and their samples would "
        f"be older than the oldest still trained on ({floor}). Use max_policy_lag >= {version - oldest} "
        f"(run.toml [trainer] max_policy_lag, or --max-policy-lag), or swap all at once (rolling=False; "
        f"`backend swap --reload` without --rolling); nothing was changed")


async def _rolling(registry: BackendRegistry, waves: list[tuple[Backend, ...]], down: tuple[str, ...],
                   directory: str, version: int, max_policy_lag: int | None, abort: bool,
                   started: float) -> SwapReport:
    floor = staleness_floor(version, max_policy_lag)
    versions = {b.url: b.policy_version for wave in waves for b in wave}
    outcomes: list[_Outcome] = []
    pending: set[str] = set()        # drained by this swap, not yet up again: undrained whatever happens
    moved = False
    try:
        async with BackendHttp() as http:
            for number, wave in enumerate(waves, 1):
                reason = f"reloading {directory} (rolling swap to version {version}, wave {number} of {len(waves)})"
                drained = registry.set_states([b.url for b in wave], BackendState.DRAINING, reason,
                                              only_from=BackendState.UP)
                pending.update(b.url for b in drained)
                results = await asyncio.gather(*(_reload_one(http, b, directory, version, abort) for b in wave))
                outcomes.extend(results)
                confirmed = [o.url for o in results if not o.problem]
                if confirmed:   # the registry's version moves with the first wave that confirms
                    registry.set_versions(confirmed, version, floor, drop=() if moved else down,
                                          undrain=[u for u in confirmed if u in pending])
                    moved = True
                    pending.difference_update(confirmed)
                    versions.update((u, version) for u in confirmed)
                failed = [o for o in results if o.problem]
                for o in failed:
                    registry.set_state(o.url, BackendState.DOWN, f"reload of {directory} failed in a rolling "
                                                                 f"swap to version {version}: {o.problem}"[:300])
                    pending.discard(o.url)
                if failed:
                    raise ReloadFailed(_rolling_failure(failed, versions, number, len(waves), directory, version,
                                                        registry.read().policy_version), versions)
    finally:
        if pending:   # interrupted, or the registry could not be written: serving old labels is safe
            try:
                registry.set_states(sorted(pending), BackendState.UP, only_from=BackendState.DRAINING)
            except LLMError as exc:
                log.error("could not mark %s up again after a rolling swap: %s; `hpc-rollout backend state "
                          "RUN URL up` does", ", ".join(sorted(pending)), exc)
    return SwapReport(version, directory, tuple(versions), down if moved else (), time.monotonic() - started,
                      {o.url: o.seconds for o in outcomes},
                      {o.url: o.aborted for o in outcomes if o.abort_supported},
                      tuple(o.url for o in outcomes if abort and not o.abort_supported),
                      tuple(tuple(b.url for b in wave) for wave in waves))


def _rolling_failure(failed: list[_Outcome], versions: dict[str, int], wave: int, waves: int, directory: str,
                     version: int, registry_version: int) -> str:
    bad = {o.url for o in failed}
    by_version: dict[int, list[str]] = {}
    for url, served in versions.items():
        if url not in bad:
            by_version.setdefault(served, []).append(url)
    serving = "; ".join(f"at version {v}: {', '.join(urls)}" for v, urls in sorted(by_version.items(), reverse=True))
    return (f"rolling swap to version {version} stopped in wave {wave} of {waves}: "
            + "; ".join(f"{o.url} did not load {directory}: {o.problem}" for o in failed)
            + f". Marked down (routers probe it again later, at its old version): {', '.join(sorted(bad))}. "
            f"Backends now {serving or 'none'}; the registry's version is {registry_version}. Fix the failed "
            f"backend(s) (or remove them: `hpc-rollout backend remove`) and swap again to finish")
