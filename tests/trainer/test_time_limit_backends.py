"""A step cut at its time limit returns only once the backends stop counting its requests.

The reproduction: CI at 2066f9d, tests/vllm/test_time_limit.py: every cut job had left its row
and its claim 0.31 s after the cancel, and at that return stock vLLM's /metrics still counted a
request running (it aborts a disconnected request at its next step, late on a loaded CPU). Here
the spool side ends at once and a backend's count stays up for a few polls: the step waits for
the count (within cancel_grace_s), and says which backend never came down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator.llm.busy import MAX_PAGE_BYTES, busy_backends, busy_registered, requests_in_flight
from orchestrator.llm.registry import BackendRegistry
from orchestrator.trainer.time_limit import GroupSlots, collect
from tests.core.util import make_run

GROUPS = GroupSlots.of("s1", tasks=1, samples=2)


class RowsAfterCancel:
    """Both rows (cancelled) appear once the cancel was made: the spool side ends at once."""

    def __init__(self) -> None:
        self.cancelled = False

    def rows(self, follow: bool = False) -> list[dict[str, Any]]:
        group = next(iter(GROUPS.rows_of_group))
        return [{"group_id": group, "sample_index": i} for i in range(2)] if self.cancelled else []

    def cancel(self, groups: list[str]) -> None:
        self.cancelled = True

    def wait(self, timeout_s: float) -> None:   # no shard to wait for: the poll period passes
        time.sleep(timeout_s)


class BusyFor:
    """A backend's count that stays up for `polls` asks after the first."""

    def __init__(self, polls: int) -> None:
        self.left, self.asked = polls, 0

    def __call__(self) -> list[str]:
        self.asked += 1
        self.left -= 1
        return ["http://gpu1:8000/v1"] if self.left >= 0 else []


def run_cut(tmp_path: Path, busy: BusyFor, grace_s: float) -> tuple[Any, float]:
    source = RowsAfterCancel()
    began = time.monotonic()
    slots, cut = collect(source, GROUPS, 2, make_run(tmp_path / "run"), source.cancel, limit_s=0.0,
                         grace_s=grace_s, poll_s=0.01, started=began, busy=busy)
    assert all(slots) and cut is not None
    return cut, time.monotonic() - began


def test_the_step_returns_only_once_the_backend_counts_no_request(tmp_path: Path) -> None:
    busy = BusyFor(polls=5)
    cut, _ = run_cut(tmp_path, busy, grace_s=30.0)
    assert busy.asked == 6, "the backends were asked until they counted nothing, then no more"
    assert cut.gone_after_s is not None and cut.still_generating == [] and cut.missing == 0
    assert cut.to_json()["still_generating"] == []


def test_a_backend_that_never_comes_down_is_named_when_the_grace_ends(tmp_path: Path) -> None:
    cut, seconds = run_cut(tmp_path, BusyFor(polls=10**9), grace_s=0.3)
    assert 0.3 <= seconds < 5.0
    assert cut.gone_after_s is None and cut.missing == 0 and cut.left_behind == []
    assert cut.still_generating == ["http://gpu1:8000/v1"]


def test_a_step_that_ends_by_itself_never_asks_the_backends(tmp_path: Path) -> None:
    group = next(iter(GROUPS.rows_of_group))

    class Done:
        def rows(self, follow: bool = False) -> list[dict[str, Any]]:
            return [{"group_id": group, "sample_index": i} for i in range(2)]

    busy = BusyFor(polls=10**9)
    slots, cut = collect(Done(), GROUPS, 2, make_run(tmp_path / "run"), lambda groups: None, limit_s=5.0,
                         grace_s=1.0, poll_s=0.01, started=time.monotonic(), busy=busy)
    assert all(slots) and cut is None and busy.asked == 0


VLLM_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
vllm:num_requests_running_total_bogus nan
"""


def test_gauges_are_read_from_vllm_and_sglang_pages() -> None:
    assert requests_in_flight(VLLM_PAGE) == 3.0
    assert requests_in_flight('sglang:num_running_reqs{tp_rank="0"} 0.0\nsglang:num_queue_reqs{tp_rank="0"} 0.0') == 0.0
    assert requests_in_flight("process_cpu_seconds_total 12.0\n") is None


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, dict[str, str]]]:
    served = {"/metrics": VLLM_PAGE}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = served.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            if body != "DRIBBLE":
                self.wfile.write((body or "").encode())
                return
            try:
                for _ in range(600):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:   # the client went away
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", served
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_busy_backends_asks_each_registered_backend_over_http(tmp_path: Path,
                                                               metrics_server: tuple[str, dict[str, str]]) -> None:
    url, served = metrics_server
    registry = BackendRegistry.of(make_run(tmp_path / "run"))
    registry.add(url)
    registry.add("http://127.0.0.1:9/v1")      # nothing listens: cannot be asked, so not waited for
    backends = registry.read().backends
    assert busy_backends(backends) == [url]
    served["/metrics"] = VLLM_PAGE.replace(" 1.0", " 0.0").replace(" 2.0", " 0.0")
    assert busy_backends(backends) == []
    del served["/metrics"]
    assert busy_backends(backends) == []


def test_a_registry_that_cannot_be_read_at_the_cut_asks_no_backend_instead_of_failing_the_step(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    (paths.root / "backends.json").write_text('{"format": 1, "backe')   # truncated: an outage, not the step's end
    assert busy_registered(BackendRegistry.of(paths)) == []


def test_a_backend_that_dribbles_or_floods_its_metrics_page_is_not_waited_for(
        tmp_path: Path, metrics_server: tuple[str, dict[str, str]]) -> None:
    url, served = metrics_server
    registry = BackendRegistry.of(make_run(tmp_path / "run"))
    registry.add(url)
    backends = registry.read().backends
    served["/metrics"] = "DRIBBLE"          # a byte every 0.1 s, for ever: bounded by the ask's own time
    began = time.monotonic()
    assert busy_backends(backends, timeout_s=0.5) == []
    assert time.monotonic() - began < 3.0
    served["/metrics"] = VLLM_PAGE + "#" * (MAX_PAGE_BYTES + 1)   # no gauge page is that large: not read
    assert busy_backends(backends) == []
