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

from collections.abc import Iterable

import httpx

from orchestrator.llm.errors import RegistryError
from orchestrator.llm.registry import Backend, BackendRegistry
from orchestrator.llm.urls import endpoint

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
    """URLs of the backends whose gauges count a request running or waiting now."""
    busy = []
    for backend in backends:
        try:
            page = httpx.get(endpoint(backend.url, "metrics"), timeout=timeout_s)
        except httpx.HTTPError:
            continue
        count = requests_in_flight(page.text) if page.status_code == 200 else None
        if count:
            busy.append(backend.url)
    return busy


def busy_registered(registry: BackendRegistry, timeout_s: float = ASK_TIMEOUT_S) -> list[str]:
    """busy_backends over the registry's backends; a registry that cannot be read now (corrupt,
    set aside) names none: it is an outage the workers deal with, not a reason to fail a step."""
    try:
        backends = registry.read().backends
    except RegistryError:
        return []
    return busy_backends(backends, timeout_s)
