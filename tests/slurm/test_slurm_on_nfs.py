"""Four Slurm nodes whose filesystem clients cache: every array task a node of the NFS-like rig
(tests/fsrig) through `launch --python`, at a Linux NFS client's default cache times."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.util import wait_until, write_jsonl
from tests.fsrig.conftest import needs_rig
from tests.fsrig.rig import NFS_DEFAULTS, REPO, Rig, sees_through_view
from tests.slurm.conftest import JobJanitor
from tests.slurm.util import SLURM_RUN, events, exactly_once, heartbeats, queued, wait_rows

pytestmark = [pytest.mark.slurm(nodes=4), needs_rig]
CLI = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


@pytest.mark.slurm(nodes=4)
def test_four_nodes_each_with_its_own_caching_view_run_every_job_once(tmp_path: Path, janitor: JobJanitor) -> None:
    rig = Rig(tmp_path / "server", tmp_path / "view", NFS_DEFAULTS)
    rig.base.mkdir()
    rig.at.mkdir()
    run_at = rig.seen_from_node(rig.base / "run")
    # slurmd opens the tasks' output files outside every node's namespace: there the run's path is
    # the server's directory itself (each task's node mounts its caching view over it).
    subprocess.run(["mount", "--bind", str(rig.base), str(rig.at)], check=True)
    try:
        run_on_four_nodes(rig, run_at, tmp_path, janitor)
    finally:
        subprocess.run(["umount", "-l", str(rig.at)], check=False)


def run_on_four_nodes(rig: Rig, run_at: Path, tmp_path: Path, janitor: JobJanitor) -> None:

    def node_cli(*args: str) -> str:
        done = subprocess.run(rig.node([*CLI, *args]), cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    node_cli("init", str(run_at), *[part for key, value in SLURM_RUN.items() for part in ("--set", f"{key}={value}")])
    python = shlex.join(rig.node([sys.executable]))   # each task's Python: a node of its own, its view at `at`
    out = node_cli("launch", str(run_at), "--nodes", "4", "--time", "00:30:00", "--python", python)
    array = re.search(r"Slurm array (\d+)", out)
    assert array, out
    janitor.add(array.group(1))
    from orchestrator.spool.paths import SpoolPaths

    paths = SpoolPaths.of(rig.base / "run")
    wait_until(lambda: len([b for b in heartbeats(paths) if b.get("state") == "running"]) == 4, 180, "4 workers")
    assert all(sees_through_view(int(b["pid"]), rig.at) for b in heartbeats(paths)), "a task bypassed its view"
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"handler": "sleep", "instance": {"run": 0.2}}] * 80)
    node_cli("submit", str(run_at), str(tasks))
    table = wait_rows(paths, 80)
    exactly_once(table, 80)
    assert len(set(table["node"])) == 4
    assert events(paths, "lease_lost") == [], "a healthy worker was fenced"
    node_cli("stop", str(run_at))
    wait_until(lambda: not queued(array.group(1)), 120, "the drained tasks to leave squeue")
