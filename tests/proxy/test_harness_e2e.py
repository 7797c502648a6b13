"""The `harness` handler end to end: real local workers, real bwrap sandboxes (the `tasks` image),
a real scripted serve-llm, and a harness of its own (tests/proxy/harness/toy_agent.py: standard
library only, it knows only OPENAI_BASE_URL / OPENAI_API_KEY / the task file). One run, one
server, one worker launch for every case:
  * a math task solved through the proxy -> reward 1, the row's columns as any handler's;
  * the harness drops its first exchange -> two prefix_merging samples, each well formed;
  * per_request -> one sample per call; a call limit stops the harness (stop_reason max_turns);
  * an endpoint the proxy does not serve gets a 404 in the API's error shape; the row names it;
  * every sampled id in the rows is the backend's record; no sandbox or proxy dir is left;
  * jobs cancelled while waiting for the RUN slot and while running leave no proxy (own worker).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from orchestrator.spool.cancel import request_cancel
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.paths import SpoolPaths
from orchestrator.proxy.trajectory import samples_of
from orchestrator.spool.rundir import init_run
from tests.agents.helpers import by_instance, rows, run_workers, submit
from tests.core.util import start_worker, stop_worker, wait_until
from tests.proxy.conftest import Backend, needs_bwrap, proxy_leftovers, short_runtime  # noqa: F401
from tests.proxy.scripts import BOXED, CASES
from tests.proxy.jobs import assert_backend_sampled, assert_well_formed
from tests.sandbox.helpers import sandbox_processes

pytestmark = [needs_bwrap, pytest.mark.llm]

HARNESS_DIR = Path(__file__).with_name("harness")
@pytest.fixture(scope="module")
def harness_run(backend: Backend, task_image: Path) -> dict[str, Any]:
    tmp = backend.paths.root.parent
    paths, _ = init_run(backend.paths.root, {"sandbox.image": str(task_image), "sandbox.runtime": "bwrap",
                                             "sandbox.allowed_binds": [str(HARNESS_DIR)]})   # the operator's choice
    tasks = tmp / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({
        "instance_id": name, "problem": f"Harness {name}.", "answer": "391",
        "harness": {"command": "python3 /harness/toy_agent.py", "binds": [f"{HARNESS_DIR}:/harness:ro"],
                    **settings}}) + "\n" for name, (_, settings) in CASES.items()))
    submit(paths, tasks, "harness")
    run_workers(paths, tmp / "sandboxes", workers=1)
    return {"rows": by_instance(rows(paths)), "backend": backend, "runtime": tmp / "sandboxes"}


def test_a_harness_solves_a_task_through_the_proxy(harness_run: dict[str, Any]) -> None:
    row = harness_run["rows"]["solve"]
    assert (row["status"], row["reward"], row["handler"], row["stop_reason"]) == ("ok", 1.0, "harness", "finished")
    result = json.loads(row["result"])
    assert result["harness_exit_code"] == 0 and "FINAL: " + BOXED in result["harness_log"]
    assert result["builder"] == "prefix_merging" and result["samples"] == [[0, 1]]
    assert len(row["turns"]) == 2 and row["policy_version_min"] == row["policy_version_max"] == 3
    # The columns hold the merged sequence: the prompt, both replies (mask 1) and the observation between.
    assert row["prompt_ids"] == row["turns"][0]["input_ids"]
    assert row["sampled_tokens"] == sum(len(t["output_ids"]) for t in row["turns"])
    assert row["prompt_ids"] + row["response_ids"][:len(row["turns"][0]["output_ids"])] == \
        row["turns"][1]["input_ids"][:len(row["prompt_ids"]) + len(row["turns"][0]["output_ids"])]


def test_every_sampled_id_is_the_backends_and_samples_are_well_formed(harness_run: dict[str, Any]) -> None:
    for row in harness_run["rows"].values():
        calls = [dict(t) for t in row["turns"]]
        assert_backend_sampled(harness_run["backend"], calls)
        samples = samples_of(row)
        assert_well_formed(samples, calls)
        main = next(s for s in samples if len(calls) - 1 in s.calls)
        assert (main.prompt_ids, main.response_ids, main.response_mask) == \
            (row["prompt_ids"], row["response_ids"], row["response_mask"])


def test_a_rewritten_history_yields_two_samples(harness_run: dict[str, Any]) -> None:
    row = harness_run["rows"]["rewrite"]
    assert row["reward"] == 1.0
    assert json.loads(row["result"])["samples"] == [[0, 1], [2, 3]]
    assert [len(s.calls) for s in samples_of(row)] == [2, 2]


def test_per_request_and_the_call_limit(harness_run: dict[str, Any]) -> None:
    per_request = harness_run["rows"]["per-request"]
    assert json.loads(per_request["result"])["samples"] == [[0], [1]]
    assert per_request["prompt_ids"] == per_request["turns"][1]["input_ids"]
    assert per_request["response_mask"] == [1] * len(per_request["turns"][1]["output_ids"])
    limited = harness_run["rows"]["limit"]
    assert (limited["status"], limited["stop_reason"], len(limited["turns"])) == ("ok", "max_turns", 2)
    assert limited["reward"] == 0.0 and json.loads(limited["result"])["refused_calls"] >= 1


def test_an_unserved_endpoint_gets_the_apis_error_and_the_row_names_it(harness_run: dict[str, Any]) -> None:
    row = harness_run["rows"]["probe"]
    result = json.loads(row["result"])
    assert row["reward"] == 1.0 and result["unserved_endpoints"] == ["GET /v1/files"]
    assert 'probe /files 404 {"error":{"message":"GET /v1/files is not served' in result["harness_log"]
    assert result["apis"] == ["chat_completions"]


def test_nothing_is_left_behind(harness_run: dict[str, Any]) -> None:
    assert sandbox_processes(harness_run["runtime"]) == []
    assert proxy_leftovers(harness_run["runtime"]) == []


# -- cancellation ----------------------------------------------------------------------------
# Cancelling harness jobs leaves nothing of their proxies: a real worker (one RUN slot), two
# harness jobs that would run two minutes. The first runs (its relay and command live in its
# sandbox), the second is prepared by INIT and waits in the node's run queue. Cancelling the
# waiting one, then the running one: both rows say `cancelled`, and no proxy socket, token or
# directory, no sandbox and no process of either command is left.

def events(paths: SpoolPaths) -> list[dict[str, Any]]:
    found = []
    for log in paths.events.glob("*.jsonl"):
        found += [orjson.loads(line) for line in log.read_bytes().splitlines() if line.strip()]
    return found


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _parent(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1].decode()
    except (OSError, IndexError):
        return "0"


def _descends_from(pid: str, needle: bytes) -> bool:
    """Whether `pid` or one of its ancestors has `needle` in its command line. A sandbox's
    processes live in its own pid namespace (bwrap --unshare-all), so they cannot outlive it
    and be re-parented out of its tree."""
    seen = 0
    while pid not in ("0", "1") and seen < 64:
        if needle in _cmdline(pid):
            return True
        pid, seen = _parent(pid), seen + 1
    return False


def processes_mentioning(marker: str, within: Path | None = None) -> list[str]:
    """Live processes whose command line holds `marker`; with `within`, only those in a process
    tree started with `within` on its command line (a test's own runtime dir), so the same CLI
    run by a concurrent test or benchmark is not taken for this test's leftover."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            cmdline = _cmdline(entry)
            if marker.encode() not in cmdline:
                continue
            if within is not None and not _descends_from(entry, str(within).encode()):
                continue
            shown = cmdline.replace(b"\0", b" ").decode(errors="replace")[:160]
            found.append(f"{entry}: {shown}")
    return found


def test_cancel_before_and_during_run_leaves_no_proxy(backend: Backend, task_image: Path, tmp_path: Path,
                                                      short_runtime: Path) -> None:
    paths, _ = init_run(tmp_path / "run", {"sandbox.image": str(task_image), "sandbox.runtime": "bwrap",
                                           "shards.idle_flush_s": 0.1, "shards.max_age_s": 0.5})
    BackendRegistry.of(paths).add(backend.server.url, protocol="vllm", version=3)
    marker = f"harness-cancel-{uuid.uuid4().hex[:8]}"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({
        "instance_id": name, "problem": "Wait.", "answer": "1",
        "harness": {"command": f"sleep 120 # {marker}"}}) + "\n" for name in ("first", "second")))
    submit(paths, tasks, "harness")
    runtime = short_runtime
    worker = start_worker(paths, "--run-pool", "1", "--init-pool", "1", "--max-prepared", "1", "--runtime", "bwrap",
                          env={"HPC_ROLLOUT_RUNTIME_DIR": str(runtime / "rt"), "HPC_ROLLOUT_LOOPBACK_DIR": str(runtime / "lo")})
    try:
        def prepared_and_running() -> tuple[set[str], set[str]]:
            seen = events(paths)
            return ({e["job"] for e in seen if e["event"] == "init_finished"},
                    {e["job"] for e in seen if e["event"] == "run_started"})

        wait_until(lambda: len(prepared_and_running()[0]) == 2 and len(prepared_and_running()[1]) == 1, 240,
                   "one harness job running and the other prepared, waiting for the RUN slot")
        wait_until(lambda: bool(processes_mentioning(marker)), 60, "the running job's command")
        prepared, running = prepared_and_running()
        (waiting,) = prepared - running
        request_cancel(paths, (waiting,))
        wait_until(lambda: len(rows(paths)) == 1, 120, "the row of the job cancelled before RUN")
        request_cancel(paths, tuple(running))
        wait_until(lambda: len(rows(paths)) == 2, 120, "the row of the job cancelled during RUN")
    finally:
        assert stop_worker(worker, timeout=120) == 0
    by_job = {r["job_id"]: r for r in rows(paths)}
    assert by_job[waiting]["status"] == "cancelled" and by_job[waiting]["error_stage"] == "run"
    (running_id,) = running
    assert by_job[running_id]["status"] == "cancelled" and by_job[running_id]["stop_reason"] == "cancelled"
    assert proxy_leftovers(runtime) == []
    assert sandbox_processes(runtime) == [] and processes_mentioning(marker) == []
