"""Is a backend still generating? Its own Prometheus gauges say, not our bookkeeping.

A cancelled job closes its connection and the server aborts the request, but only at its next
step: a CPU vLLM in the middle of a forward pass on a loaded node still counted the request as
running 0.3 s after every cut job had left its row (seen in CI). A trainer that puts its servers
to sleep right after a step (verl) must wait for the server's own count, so the time limit
(orchestrator/trainer/time_limit.py) asks here after the cut jobs are gone.

Gauges read: vLLM's (serve-llm uses the same names) and SGLang's (served with --enable-metrics).
A backend that cannot be asked (no /metrics, unreachable, no known gauge) is left out: nothing
can be waited for there, and the caller's own grace bounds the wait anyway.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import httpx

from orchestrator.llm.errors import RegistryError
from orchestrator.llm.registry import Backend, BackendRegistry
from orchestrator.llm.urls import endpoint

MAX_PAGE_BYTES = 8 << 20   # vLLM's page with every histogram is ~100-300 KB
MAX_ASKS_AT_ONCE = 16
BUSY_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
               "sglang:num_running_reqs", "sglang:num_queue_reqs")
ASK_TIMEOUT_S = 2.0


def requests_in_flight(metrics_page: str) -> float | None:
    """Requests running or waiting by a /metrics page's gauges; None: the page has none of them."""
    found: float | None = None
    for line in metrics_page.splitlines():
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        if name.strip() not in BUSY_GAUGES:
            continue
        try:
            value = float(rest.rsplit(" ", 1)[-1])
        except ValueError:
            continue
        if value == value:      # NaN: no count
            found = (found or 0.0) + value
    return found


def busy_backends(backends: Iterable[Backend], timeout_s: float = ASK_TIMEOUT_S) -> list[str]:
    """URLs of the backends whose gauges count a request running or waiting now; all asked at
    once, each for `timeout_s` at most, so one slow backend does not stretch a step's grace."""
    urls = [backend.url for backend in backends]
    if len(urls) <= 1:
        counts = [in_flight_at(url, timeout_s) for url in urls]
    else:
        with ThreadPoolExecutor(max_workers=min(MAX_ASKS_AT_ONCE, len(urls))) as pool:
            counts = list(pool.map(lambda url: in_flight_at(url, timeout_s), urls))
    return [url for url, count in zip(urls, counts) if count]


def in_flight_at(url: str, timeout_s: float = ASK_TIMEOUT_S) -> float | None:
    """Requests the backend at `url` counts now; None: it cannot be asked (no /metrics, no gauge,
    unreachable, slower than `timeout_s` in all, or a page no gauge list is as large as)."""
    deadline = time.monotonic() + timeout_s
    page = bytearray()
    try:
        with httpx.stream("GET", endpoint(url, "metrics"), timeout=timeout_s) as response:
            if response.status_code != 200:
                return None
            for chunk in response.iter_bytes():
                page += chunk
                if len(page) > MAX_PAGE_BYTES or time.monotonic() > deadline:
                    return None
    except httpx.HTTPError:
        return None
    return requests_in_flight(page.decode("utf-8", "replace"))


def busy_registered(registry: BackendRegistry, timeout_s: float = ASK_TIMEOUT_S) -> list[str]:
    """busy_backends over the registry's backends; a registry that cannot be read now (corrupt,
    set aside) names none: it is an outage the workers deal with, not a reason to fail a step."""
    try:
        backends = registry.read().backends
    except RegistryError:
        return []
    return busy_backends(backends, timeout_s)
