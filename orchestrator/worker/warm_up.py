"""The worker's warm-up, before it claims a job: the policy's tokenizers loaded, transformers and the
HTTP client (aiohttp) imported.

Loading a tokenizer (and importing transformers, the first time) took seconds, up to ~30 s on a
loaded node; done by the first job that needed it, it counted in that job's RUN time and budget
and made "run p50" measure a worker's start (issue 39). So a worker with RUN slots loads the
tokenizers of the registered backends first, while its heartbeat already beats, and reports how
long that took (`warm_up_s` in its heartbeat, `status`; the `worker_warmed` event). A backend that
names no tokenizer or model directory is asked its model once (a short timeout); one that does not
answer is left to the first job, as before. A stop request ends the warm-up at once.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from typing import Any

from orchestrator.llm.registry import Backend, BackendRegistry
from orchestrator.llm.session import cached_tokenizer, tokenizer_directory
from orchestrator.spool.paths import SpoolPaths

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 3.0       # a backend asked for its model: it may be starting, or gone
WARM_UP_LIMIT_S = 300.0   # never hold the worker's jobs back longer than this


async def warm_up(paths: SpoolPaths, stopping: asyncio.Event) -> dict[str, Any]:
    """Load the registered backends' tokenizers; what was done, for the heartbeat and the event."""
    started = time.monotonic()
    try:
        backends = BackendRegistry.of(paths).read().backends
    except Exception as exc:   # an unreadable registry is the LLM router's to report, per job
        log.info("warm-up skipped: the backend registry is unreadable (%s)", exc)
        backends = ()
    directories: list[str] = []
    for backend in backends:
        path = backend.tokenizer or backend.model or await asyncio.to_thread(_served_model, backend)
        resolved = tokenizer_directory(path) if path else None
        if resolved is not None and resolved not in directories:
            directories.append(resolved)
    if backends:   # the HTTP client's import (TLS contexts built): here, not in the first job's RUN
        await asyncio.to_thread(importlib.import_module, "aiohttp")
    loaded = 0
    for directory in directories:
        load = asyncio.ensure_future(asyncio.to_thread(cached_tokenizer, directory))
        stop = asyncio.ensure_future(stopping.wait())
        done, _ = await asyncio.wait({load, stop}, timeout=WARM_UP_LIMIT_S, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if load not in done:
            break   # stopping, or too long: the thread finishes on its own, the jobs wait no more
        if load.exception() is None:
            loaded += 1
        else:
            log.warning("warm-up: could not load the tokenizer in %s: %s", directory, load.exception())
    return {"seconds": round(time.monotonic() - started, 3), "tokenizers": loaded}


def _served_model(backend: Backend) -> str | None:
    """The model id a backend serves (/v1/models), or None if it does not say within the timeout."""
    import httpx

    base = backend.url.rstrip("/")
    url = base + ("/models" if base.endswith("/v1") else "/v1/models")
    try:
        data = httpx.get(url, timeout=ASK_TIMEOUT_S).json().get("data") or []
        return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
