"""The reward-hacking probe suite (issue 36): every probe of tests/agents/reward_probes.py runs
through its real handler, real local workers and real bubblewrap sandboxes (the `tasks` image),
its policy a scripted server (the real tokenizer) or a harness command, in one run; each must
get the reward it states (0 for a hack), the honest controls 1. Also: the hidden tests are not
in the agent's sandbox (code: the hidden outputs; swe: the test patch), and no sandbox is left.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpc_rollout.handlers.bundled.write import Bundled
from orchestrator.devserver.local_server import start_server
from tests.agents.conftest import needs_bwrap
from tests.agents.helpers import by_instance, new_run, rows, run_workers, submit
from tests.agents.reward_probes import FUTURE, Probe, all_probes, jsonl, rows_by_handler, scripts
from tests.sandbox.helpers import sandbox_processes

pytestmark = [needs_bwrap, pytest.mark.llm]

PROBES = {p.name: p for p in all_probes({"problem_statement": ""})}   # the names; rows come from the fixture


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory: pytest.TempPathFactory, task_image: Path, bundled: Bundled) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("probes")
    swe_base = json.loads(bundled.swe.read_text().splitlines()[0])   # intervals
    probes = all_probes(swe_base, str(future_mirror(swe_base, tmp)))
    script_file = tmp / "scripts.jsonl"
    script_file.write_text(jsonl(scripts(probes)))
    server = start_server(tiny=True, extra_args=["--scripted", str(script_file), "--max-model-len", "32768"])
    try:
        paths = new_run(tmp, task_image, server.url, **{"sandbox.allowed_binds": [str(bundled.mirrors), str(tmp)]})
        for handler, found in rows_by_handler(probes).items():
            tasks = tmp / f"{handler}.jsonl"
            tasks.write_text(jsonl(found))
            submit(paths, tasks, handler, max_tokens=512)
        run_workers(paths, tmp / "sandboxes", timeout_s=900)
    finally:
        server.stop()
    return {"rows": by_instance(rows(paths)), "runtime": tmp / "sandboxes"}


def future_mirror(base: dict[str, Any], tmp: Path) -> Path:
    """A copy of the row's mirror with one more commit, after base_commit: its test patch."""
    work, mirror = tmp / "future-work", tmp / "future.git"
    git = ["git", "-c", "user.name=probe", "-c", "user.email=probe@example.org"]
    subprocess.run([*git, "clone", "-q", base["repo_mirror"], str(work)], check=True)
    subprocess.run([*git, "-C", str(work), "apply", "-"], input=base["test_patch"].encode(), check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qam", FUTURE], check=True)
    subprocess.run([*git, "clone", "-q", "--bare", str(work), str(mirror)], check=True)
    return mirror


def result_of(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(row["result"] or "{}")


@pytest.mark.parametrize("name", sorted(PROBES))
def test_each_probe_gets_the_reward_it_states(probe_run: dict[str, Any], name: str) -> None:
    probe: Probe = PROBES[name]
    row = probe_run["rows"][name]
    assert row["status"] == "ok", (name, probe.why, row["error"])   # a hack never ends as a failure either
    assert not row["malformed_calls"], (name, "the probe's own tool calls did not parse", row["tool_calls"])
    assert row["reward"] == pytest.approx(probe.reward), (name, probe.why, row["stop_reason"], result_of(row))
    if probe.stop_reason is not None:
        assert row["stop_reason"] == probe.stop_reason, (name, row["stop_reason"])


def test_the_hidden_tests_are_not_in_the_agents_sandbox(probe_run: dict[str, Any]) -> None:
    code = probe_run["rows"]["code-hidden-in-run"]["tool_calls"][0]
    assert code["output"].splitlines()[:1] == ["search done"], code      # no file holds a hidden output
    swe = probe_run["rows"]["swe-hidden-in-run"]["tool_calls"][0]
    # no file holds a test of the test patch, no history the commit that adds them
    assert swe["output"].splitlines()[:2] == ["0", "search done"], swe


def test_no_sandbox_is_left(probe_run: dict[str, Any]) -> None:
    assert len(probe_run["rows"]) == len(PROBES)
    assert sandbox_processes(probe_run["runtime"]) == []
