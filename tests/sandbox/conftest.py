"""Fixtures for the sandbox tests: private runtime and lease directories per test."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.spool.paths import SpoolPaths
from tests.sandbox.helpers import sandbox_processes


@pytest.fixture(autouse=True)
def private_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short node-local runtime dir (socket paths < 108 bytes) and lease dir per test."""
    base = Path(tempfile.mkdtemp(prefix="hr-", dir="/tmp"))
    monkeypatch.setenv("HPC_ROLLOUT_RUNTIME_DIR", str(base / "rt"))
    monkeypatch.setenv("HPC_ROLLOUT_LOOPBACK_DIR", str(base / "lo"))
    yield base
    leftovers = sandbox_processes(base)
    for pid, _ in leftovers:  # fail loudly, but never leave them running
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(base, ignore_errors=True)
    assert not leftovers, f"sandbox processes left behind: {leftovers}"


@pytest.fixture
def spool(tmp_path: Path) -> SpoolPaths:
    return SpoolPaths.of(tmp_path / "spool")


