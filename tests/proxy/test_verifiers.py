"""A verifiers v1 taskset as tasks: tests/proxy/verifiers_toy.py (three sums, its own @vf.reward)
run by verifiers 0.4.0 (from the package index) with its `null` harness inside a bubblewrap
sandbox with no network, via the `verifiers` handler and a real local worker, against the
scripted backend: verifiers' interception server streams its calls through the job's recording
proxy; two replies are right (reward 1 from the taskset's own function) and one is wrong
(reward 0); each row's token ids, masks and log-probs are the backend's; a taskset verifiers
cannot import fails its job with the traceback in the row; nothing is left behind.
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
from tests.proxy.verifiers_venv import VENV
from tests.proxy.conftest import needs_bwrap, proxy_leftovers, short_runtime  # noqa: F401
from tests.proxy.jobs import check_fidelity
from tests.sandbox.helpers import sandbox_processes

pytestmark = [needs_bwrap, pytest.mark.llm]

TOY_DIR = Path(__file__).parent
# The toy's questions, the scripted replies and the rewards its reward function must give.
SCRIPTED = [("What is 2 + 3?", "5", 1.0), ("What is 17 + 25?", "41", 0.0), ("What is 40 + 2?", "The sum is 42.", 1.0)]


@pytest.fixture(scope="module")
def verifiers_venv() -> Path:
    return VENV.for_tests()


def test_a_verifiers_taskset_runs_as_tasks_through_the_proxy(tmp_path: Path, short_runtime: Path, task_image: Path,
                                                             verifiers_venv: Path) -> None:
    scripts = tmp_path / "scripts.jsonl"
    scripts.write_text("".join(json.dumps({"match": question, "replies": [reply]}) + "\n"
                               for question, reply, _ in SCRIPTED))
    record = tmp_path / "record.jsonl"
    server = start_server(tiny=True, record=record, extra_args=["--scripted", str(scripts), "--max-model-len", "32768"])
    try:
        paths, _ = init_run(tmp_path / "run", {"sandbox.image": str(task_image), "sandbox.runtime": "bwrap",
                                               "sandbox.allowed_binds": [str(verifiers_venv), str(TOY_DIR)],
                                               "shards.idle_flush_s": 0.1, "shards.max_age_s": 0.5})
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=1)
        tasks = [{"instance_id": f"sum-{index}", "verifiers": {
            "taskset": "verifiers_toy", "path": str(TOY_DIR), "index": index, "harness": "null",
            "venv": str(verifiers_venv), "max_calls": 4, "max_wall_s": 300}} for index in range(len(SCRIPTED))]
        # A taskset verifiers cannot import: the job fails, its row saying why.
        tasks.append({"instance_id": "missing", "verifiers": {**tasks[0]["verifiers"], "taskset": "no_such_taskset"}})
        (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
        assert submit(paths, tmp_path / "tasks.jsonl", "verifiers") == len(tasks)
        run_workers(paths, short_runtime, workers=1)
        assert sandbox_processes(short_runtime) == [] and proxy_leftovers(short_runtime) == []
        found = by_instance(rows(paths))
    finally:
        server.stop()
    served = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(found) == ["missing", *(f"sum-{index}" for index in range(len(SCRIPTED)))]
    missing = found["missing"]
    assert (missing["status"], missing["reward"]) == ("failed", None) and "reported no reward" in missing["error"]
    assert "no_such_taskset" in json.loads(missing["result"])["harness_log"] and not missing["turns"]
    for index, (_, reply, reward) in enumerate(SCRIPTED):
        row: dict[str, Any] = found[f"sum-{index}"]
        result = json.loads(row["result"])
        assert (row["status"], row["reward"]) == ("ok", reward), row["error"] or result.get("harness_log")
        assert result["harness_exit_code"] == 0 and result["reported_reward"] == reward
        assert len(row["turns"]) == 1 and row["turns"][0]["output_ids"] and reply in result["final_text"]
        check_fidelity(row, served)   # ids, masks, log-probs: the backend's, from the proxy's record


def test_a_task_without_a_venv_is_refused_at_submit(tmp_path: Path) -> None:
    from orchestrator.submission.submit import submit_file

    paths, _ = init_run(tmp_path / "run", {})
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"verifiers": {"taskset": "verifiers_toy"}}) + "\n")
    report = submit_file(paths, tmp_path / "tasks.jsonl", handler="verifiers")
    assert report.jobs == 0 and "verifiers.venv" in str(report.rejected)
