"""A real third-party harness: mini-swe-agent (from the package index, tool-calling mode, through
litellm and the openai client) inside a bubblewrap sandbox with no network, via the `harness`
handler and real local workers:
  * driven by the scripted backend, it applies the fix of a bundled SWE task -> reward 1 from
    the `swe` family's own grading, and its calls extend each other (one merged sample);
  * driven by the random tiny model, it fails cleanly: a row with reward 0 (it gives up on its
    own, or the call limit stops it), every sampled id the backend's; as it drops replies cut by
    max_tokens from its history, each call is a sample of its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.devserver.local_server import start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.rundir import init_run
from tests.agents.helpers import by_instance, rows, run_workers, submit
from tests.proxy import mini_swe_agent
from tests.proxy.conftest import needs_bwrap, proxy_leftovers, short_runtime  # noqa: F401
from tests.proxy.scripts import tool_call
from tests.proxy.jobs import check_fidelity
from tests.sandbox.helpers import sandbox_processes

pytestmark = [needs_bwrap, pytest.mark.llm]

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def harness_rows(tmp: Path, runtime: Path, image: Path, swe_row: dict[str, Any], venv: Path, server_args: list[str],
                 harness: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    record = tmp / "record.jsonl"
    server = start_server(tiny=True, record=record, extra_args=[*server_args, "--max-model-len", "32768"])
    try:
        paths, _ = init_run(tmp / "run", {"sandbox.image": str(image), "sandbox.runtime": "bwrap",
                                          "sandbox.allowed_binds": [str(venv), str(Path(swe_row["repo_mirror"]).parent)],
                                          "shards.idle_flush_s": 0.1, "shards.max_age_s": 0.5})
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=1)
        task = {**swe_row, "harness": {"command": mini_swe_agent.command(), "binds": [mini_swe_agent.bind(venv)],
                                       "env": mini_swe_agent.ENV, **harness}}
        (tmp / "tasks.jsonl").write_text(json.dumps(task) + "\n")
        submit(paths, tmp / "tasks.jsonl", "harness")
        run_workers(paths, runtime, workers=1)
        assert sandbox_processes(runtime) == [] and proxy_leftovers(runtime) == []
        found = by_instance(rows(paths))
    finally:
        server.stop()
    served = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return found[swe_row["instance_id"]], served


@pytest.fixture(scope="module")
def mini_swe_agent_venv() -> Path:
    return mini_swe_agent.installed_for_tests()


@pytest.fixture(scope="module")
def swe_row(bundled: Any) -> dict[str, Any]:
    return json.loads(bundled.swe.read_text().splitlines()[0])


def test_mini_swe_agent_solves_a_bundled_swe_task(tmp_path: Path, short_runtime: Path, task_image: Path,
                                                   swe_row: dict[str, Any], mini_swe_agent_venv: Path) -> None:
    title = swe_row["problem_statement"].splitlines()[0]
    fix = f"cd /workspace/repo && git apply <<'PATCH'\n{swe_row['patch'].rstrip(chr(10))}\nPATCH"
    scripts = tmp_path / "scripts.jsonl"
    scripts.write_text(json.dumps({"match": title, "replies": [
        "I will apply the fix." + tool_call("bash", command=fix),
        "Now I submit." + tool_call("bash", command=SUBMIT)]}) + "\n")
    row, served = harness_rows(tmp_path, short_runtime, task_image, swe_row, mini_swe_agent_venv, ["--scripted", str(scripts)], {"max_calls": 6})
    result = json.loads(row["result"])
    assert (row["status"], row["reward"], row["stop_reason"]) == ("ok", 1.0, "finished"), row["error"] or result.get("harness_log")
    assert result["harness_exit_code"] == 0 and result["resolved"] is True
    assert len(row["turns"]) == 2 and result["samples"] == [[0, 1]]   # its second call extends its first
    check_fidelity(row, served)


def test_mini_swe_agent_with_the_random_model_fails_cleanly(tmp_path: Path, short_runtime: Path, task_image: Path,
                                                           swe_row: dict[str, Any], mini_swe_agent_venv: Path) -> None:
    row, served = harness_rows(tmp_path, short_runtime, task_image, swe_row, mini_swe_agent_venv, [],
                               {"max_calls": 3, "max_tokens_per_call": 24})
    result = json.loads(row["result"])
    assert (row["status"], row["reward"]) == ("ok", 0.0), row["error"] or result.get("harness_log")
    # It stops itself (RepeatedFormatError: the random text holds no tool call) or the call limit does.
    assert row["stop_reason"] in ("finished", "max_turns") and 1 <= len(row["turns"]) <= 3
    assert isinstance(result["harness_exit_code"], int) and result["resolved"] is False
    check_fidelity(row, served)
    # mini-swe-agent drops a reply cut by max_tokens from its history: each call is a sample of its own.
    if all(t["finish_reason"] == "length" for t in row["turns"]):
        assert result["samples"] == [[i] for i in range(len(row["turns"]))]
