"""Fixtures for the Slurm tests: the real single-host cluster (scripts/slurm-up.sh), cleanup by job id."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.slurm_probe import Cluster, require


@pytest.fixture
def slurm_cluster(request: pytest.FixtureRequest) -> Cluster:
    """The cluster, when it has what the test's `slurm` marks ask for (module mark first, the
    test's own last: `@pytest.mark.slurm(nodes=4)`); else a skip naming what is missing."""
    needs: dict[str, object] = {}
    for marker in reversed(list(request.node.iter_markers("slurm"))):
        needs.update(marker.kwargs)
    return require(**needs)


@pytest.fixture(autouse=True)
def _slurm_marked_tests_check_the_cluster(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("slurm"):
        request.getfixturevalue("slurm_cluster")


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
def janitor(slurm_cluster: Cluster) -> Iterator[JobJanitor]:
    jobs = JobJanitor()
    yield jobs
    jobs.cleanup()


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    return tmp_path / "run"
