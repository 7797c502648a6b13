"""Fixtures for the Slurm tests: the real single-host cluster (scripts/slurm-up.sh), cleanup by job id."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.slurm.cluster import slurm_available

NODES_NEEDED = 4


def _cluster_problem() -> str | None:
    if not slurm_available():
        return "no Slurm client on PATH: start the cluster with `sudo SLURM_NODES=4 scripts/slurm-up.sh`"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15)
        nodes = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t"],
                               capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "the Slurm controller does not answer"
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return "the Slurm controller is down: `sudo SLURM_NODES=4 scripts/slurm-up.sh`"
    # Busy is fine (a previous test's tasks may still be completing); down or drained is not.
    usable = {line.split()[0] for line in nodes.stdout.splitlines()
              if line.split()[1].rstrip("*~#$@+") in ("idle", "mix", "alloc", "comp", "mixed", "allocated")}
    if len(usable) < NODES_NEEDED:
        return f"the Slurm tests need {NODES_NEEDED} usable nodes, found {sorted(usable)}: SLURM_NODES=4 scripts/slurm-up.sh"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    problem = _cluster_problem()
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
