"""`hpc-rollout backend wait`: ready means one completed token; a dead server or a refusal ends the wait."""

from __future__ import annotations

import subprocess
import time

from tests.core.util import cli
from tests.llm.standin import StandIn


def test_wait_returns_once_one_token_is_completed() -> None:
    with StandIn() as server:
        done = cli("backend", "wait", server.url, "--protocol", "sglang", "--model", "m", "--timeout", "60")
        asked = server.requests
    assert done.stdout.startswith(f"{server.url} is serving: 1 token")
    assert [r["sampling_params"]["max_new_tokens"] for r in asked] == [1]


def test_wait_stops_when_the_server_process_is_gone() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    began = time.monotonic()
    done = cli("backend", "wait", "http://127.0.0.1:9/v1", "--timeout", "600", "--pid", str(gone.pid), check=False)
    assert done.returncode == 1 and f"server process {gone.pid} exited" in done.stderr
    assert time.monotonic() - began < 120   # not the 600 s timeout


def test_a_server_that_refuses_the_request_is_reported_at_once() -> None:
    with StandIn() as server:   # speaks SGLang only: /v1/completions is a 404
        done = cli("backend", "wait", server.url, "--protocol", "vllm", "--model", "m", "--timeout", "600", check=False)
    assert done.returncode == 1 and "rejects a one-token completion" in done.stderr and "HTTP 404" in done.stderr
