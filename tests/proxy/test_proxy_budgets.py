"""An agent cannot exhaust its worker through the proxy (issue 22, item 4):
  * a body over the job's limit (run.toml [proxy] max_body_mb) is refused with 413 in the API's
    own shape before it is read or parsed, whether it announces its length or comes chunked;
  * text beyond what the context's room could hold (max_chars_per_token characters per token) is
    refused as context_full before it is tokenized;
  * with a real worker: a harness sending two 20 MB bodies while a neighbour job runs on the same
    worker grows the worker's peak RSS by < 100 MB and leaves the neighbour's RUN time as it is.
    (Before: 256 MiB bodies were accepted, and the whole conversation was rendered and tokenized
    on the worker's event loop: two 20 MB requests took 3.67 GB and made a 1 s job take 20.8 s.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.llm.registry import BackendRegistry
from orchestrator.proxy.recorder import ProxyLimits
from orchestrator.proxy.server import new_proxy_dir
from orchestrator.spool.rundir import init_run
from tests.agents.helpers import rows, submit
from tests.core.util import start_worker, stop_worker, wait_until
from tests.proxy.conftest import Backend, needs_bwrap, proxy_leftovers, short_runtime  # noqa: F401
from tests.proxy.jobs import Job
from tests.proxy.test_harness_e2e import events, processes_mentioning

pytestmark = [pytest.mark.llm]
MB = 1 << 20
NEIGHBOUR_RUN_S = 6.0


def test_a_body_over_the_limit_is_refused_before_it_is_read(backend: Backend, tmp_path: Path) -> None:
    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-big", max_body_bytes=1 * MB) as job, \
            job.http(job.token) as http:
        big = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"x" * (2 * MB) + b'"}]}'
        told = http.post("/chat/completions", content=big, headers={"Content-Type": "application/json"})
        assert told.status_code == 413 and told.json()["error"]["code"] == "request_too_large"
        assert "at most 1048576 bytes" in told.json()["error"]["message"]
        chunked = http.post("/messages", content=iter([big[:MB], big[MB:]]),
                            headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"})
        assert chunked.status_code == 413 and chunked.json()["error"]["type"] == "request_too_large"
        fits = http.post("/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "Task sandbox."}]})
        assert fits.status_code == 200
        assert job.recorder is not None and len(job.recorder.calls) == 1


def test_text_beyond_the_context_is_refused_before_it_is_tokenized(backend: Backend, tmp_path: Path) -> None:
    limits = ProxyLimits(max_calls=5, max_context_tokens=1000, max_chars_per_token=16)
    with Job(backend, new_proxy_dir(tmp_path / "px"), "job-long", limits=limits) as job, job.http(job.token) as http:
        began = time.perf_counter()
        answer = http.post("/chat/completions", json={"model": "x", "messages": [
            {"role": "user", "content": "Task sandbox. " + "word " * 200_000}]})
        took = time.perf_counter() - began
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"
        assert "1000014 characters" in answer.json()["error"]["message"] and "not tokenized" in answer.json()["error"]["message"]
        assert job.recorder is not None and job.recorder.calls == [] and job.recorder.stop_reason == "context_full"
    assert took < 5.0   # rendering and tokenizing a million characters would take longer than refusing them


ATTACK = """
import json, os, urllib.request, urllib.error
while not os.path.exists("/gate/open"):
    import time; time.sleep(0.05)
body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "x" * 20_000_000}]}).encode()
for attempt in range(2):
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body, {
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=600)
        print("ATTEMPT", attempt, "accepted", flush=True)
    except urllib.error.HTTPError as exc:
        print("ATTEMPT", attempt, "refused", exc.code, flush=True)
    except OSError as exc:
        print("ATTEMPT", attempt, "failed", exc, flush=True)
"""


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


@needs_bwrap
def test_two_20mb_bodies_neither_grow_the_worker_nor_slow_its_neighbour(backend: Backend, tmp_path: Path,
                                                                       short_runtime: Path) -> None:
    # the operator lets rows bind from this test's directory (run.toml [sandbox] allowed_binds)
    paths, _ = init_run(tmp_path / "run", {"sandbox.runtime": "bwrap", "shards.idle_flush_s": 0.1,
                                           "shards.max_age_s": 0.5, "sandbox.allowed_binds": [str(tmp_path)]})
    BackendRegistry.of(paths).add(backend.server.url, protocol="vllm", version=3)
    (tmp_path / "attack.py").write_text(ATTACK)
    gate = tmp_path / "gate"
    gate.mkdir()
    marker = f"attack-{time.monotonic_ns()}"
    (tmp_path / "attack.jsonl").write_text(json.dumps({"instance_id": "attacker", "problem": "Wait.", "answer": "1", "harness": {
        "command": f"python3 /attack/attack.py # {marker}",
        "binds": [f"{tmp_path}:/attack:ro", f"{gate}:/gate:ro"]}}) + "\n")
    (tmp_path / "neighbour.jsonl").write_text(json.dumps({"instance_id": "neighbour", "run": NEIGHBOUR_RUN_S}) + "\n")
    submit(paths, tmp_path / "attack.jsonl", "harness")
    worker = start_worker(paths, "--run-pool", "2", "--init-pool", "2", "--runtime", "bwrap",
                          env={"HPC_ROLLOUT_RUNTIME_DIR": str(short_runtime / "rt"),
                               "HPC_ROLLOUT_LOOPBACK_DIR": str(short_runtime / "lo")})
    try:
        wait_until(lambda: any(e["event"] == "run_started" for e in events(paths)), 120, "the attacker running")
        wait_until(lambda: bool(processes_mentioning(marker)), 60, "the attacking command, at its gate")
        before = peak_rss_mb(worker.pid)
        # The attack and the neighbour start together: the neighbour's RUN spans the attack's requests.
        (gate / "open").touch()
        submit(paths, tmp_path / "neighbour.jsonl", "sleep")
        wait_until(lambda: len(rows(paths)) == 2, 300, "both rows")
        grown = peak_rss_mb(worker.pid) - before
    finally:
        assert stop_worker(worker, timeout=120) == 0
    found: dict[str, dict[str, Any]] = {row["instance_id"]: row for row in rows(paths)}
    attacker, neighbour = found["attacker"], found["neighbour"]
    log = json.loads(attacker["result"] or "{}").get("harness_log", "")
    seen = (f"peak RSS grew {grown:.0f} MB, neighbour run_s {neighbour['run_s']:.1f} (of {NEIGHBOUR_RUN_S}), attacker "
            f"{attacker['status']} {attacker['error']} log {log[-300:]!r}")
    print(seen)
    assert log.count("refused 413") == 2, seen
    assert grown < 100, seen
    assert neighbour["status"] == "ok" and neighbour["run_s"] < NEIGHBOUR_RUN_S + 2.0, seen
    assert proxy_leftovers(short_runtime) == []
