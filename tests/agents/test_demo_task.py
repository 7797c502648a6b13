"""`hpc-rollout demo --task swe`: the bundled SWE tasks end to end with the scripted policy."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agents.conftest import needs_bwrap
from tests.agents.helpers import CLI

pytestmark = [needs_bwrap, pytest.mark.llm]


def test_demo_task_swe_solves_the_bundled_repositories(tmp_path: Path, task_image: Path) -> None:
    done = subprocess.run(CLI + ["demo", "--task", "swe", "--samples", "1", "--workers", "1", "--dir",
                                 str(tmp_path / "demo"), "--image", str(task_image)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "3 swe trajectories (scripted policy)" in done.stdout and "mean reward 1.00" in done.stdout
    assert "stop reasons {'finished': 3}" in done.stdout
    assert "str_replace_editor" in done.stdout and "hpc-rollout inspect" in done.stdout
