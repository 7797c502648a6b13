"""Fixtures for the Slurm tests: the real single-host cluster (scripts/slurm-up.sh), cleanup by job id."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.slurm_probe import cluster_problem


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    problem = cluster_problem()
    if problem:
        # CI runs as root with scripts/slurm-up.sh: there a missing cluster is a failure, not a skip.
        if os.environ.get("CI") or os.geteuid() == 0:
            pytest.fail(f"the Slurm tests must run here (CI or root): {problem}")
        pytest.skip(f"{problem} (needs root; skipped for a normal user)")


class JobJanitor:
    """Job ids a test created; every one still queued is scancelled at teardown (never by name)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def add(self, job_id: str) -> str:
        self.ids.append(job_id)
        return job_id

    def cleanup(self) -> None:
        if self.ids:
            subprocess.run(["scancel", *self.ids], capture_output=True, timeout=30)


@pytest.fixture
def janitor(slurm_cluster: None) -> Iterator[JobJanitor]:
    jobs = JobJanitor()
    yield jobs
    jobs.cleanup()


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    return tmp_path / "run"
