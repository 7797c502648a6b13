"""Fixtures of the agent tests: the task image (built once, cached), the bundled task sets,
scripted and tiny serve-llm backends, and a private sandbox runtime dir checked for leftovers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpc_rollout.handlers.bundled.write import Bundled, write_bundled
from tests.agents.helpers import task_image_path
from tests.sandbox.conftest import private_runtime, spool  # noqa: F401  (autouse: no sandbox left behind)

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap is not installed; scripts/test.sh installs it")


@pytest.fixture(scope="session")
def task_image() -> Path:
    """The `tasks` image (python3, numpy, sympy, pytest, git) in the bubblewrap directory format."""
    return task_image_path()


@pytest.fixture(scope="session")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Bundled:
    return write_bundled(tmp_path_factory.mktemp("bundled"))

