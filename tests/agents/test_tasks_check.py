"""`hpc-rollout tasks check`: golden must score 1, no-op 0, in sandboxes, in parallel; a planted
broken task (its golden patch does not fix the bug) and a planted trivial one (its
FAIL_TO_PASS tests already pass) are listed, the good ones are not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_rollout.handlers.bundled.write import Bundled
from tests.agents.conftest import needs_bwrap

pytestmark = [needs_bwrap]
CLI = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


def check(tasks: Path, handler: str, image: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + ["tasks", "check", str(tasks), "--handler", handler, "--image", str(image),
                                 "--runtime", "bwrap", *extra],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))


def test_bundled_tasks_pass_and_planted_bad_ones_are_listed(tmp_path: Path, task_image: Path, bundled: Bundled) -> None:
    good, second, third = [json.loads(line) for line in bundled.swe.read_text().splitlines()]
    broken = {**second, "instance_id": "planted-broken", "patch": ""}            # no golden fix
    broken["patch"] = good["patch"]                                               # a fix for another repo
    trivial = {**third, "instance_id": "planted-trivial", "FAIL_TO_PASS": third["PASS_TO_PASS"][:1]}
    tasks = tmp_path / "swe.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in (good, broken, trivial)))
    refused = check(tasks, "swe", task_image)   # rows' repo_mirrors are binds: allowed only when said so
    assert refused.returncode == 1 and "sandbox.allowed_binds" in refused.stdout, refused.stdout + refused.stderr
    done = check(tasks, "swe", task_image, "--allow-bind", str(bundled.mirrors))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "3 tasks checked: 1 ok, 2 failing" in done.stdout
    assert f"{tasks}:2 (planted-broken)" in done.stdout and "golden" in done.stdout
    assert f"{tasks}:3 (planted-trivial)" in done.stdout and "no-op scores above 0 (trivial task)" in done.stdout
    assert "intervals-1" not in done.stdout
    assert "tasks" in done.stderr and "3/3" in done.stderr   # the progress bar


@pytest.mark.parametrize("family", ["math", "code"])
def test_bundled_math_and_code_tasks_are_admitted(family: str, task_image: Path, bundled: Bundled) -> None:
    done = check(bundled.tasks(family), family, task_image, "--json", "--parallel", "8")
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == {"math": 20, "code": 10}[family]
    assert all(r["ok"] and r["scores"] == {"golden": 1.0, "noop": 0.0} for r in results), results


def test_a_code_task_with_a_wrong_expected_output_is_broken(tmp_path: Path, task_image: Path, bundled: Bundled) -> None:
    row = json.loads(bundled.code.read_text().splitlines()[0])
    row["tests"][1]["output"] = "42\n"
    tasks = tmp_path / "code.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    done = check(tasks, "code", task_image)
    assert done.returncode == 1 and "golden solution does not score 1" in done.stdout
    assert "'wrong_answer': 1" in done.stdout
