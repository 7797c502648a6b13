"""`hpc-rollout doctor --nodes 2` on the test cluster: one sbatch of two nodes, an agent on each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.core.util import cli, make_run

pytestmark = pytest.mark.slurm(nodes=2)


def test_doctor_measures_between_two_slurm_nodes_and_records_the_lease(run_root: Path) -> None:
    paths = make_run(run_root)
    done = cli("doctor", str(paths.root), "--nodes", "2", "--json", timeout=900)
    report = json.loads(done.stdout)
    assert len(set(report["hosts"])) == 2, report["hosts"]          # one agent on each node
    assert all(v["ok"] for v in report["verdicts"]), [v for v in report["verdicts"] if not v["ok"]]
    assert any(v["name"] == "clock offset between the nodes" for v in report["verdicts"])
    record = json.loads((paths.control / "filesystem.json").read_text())
    assert sorted(record["hosts"]) == sorted(report["hosts"]) and record["delays_s"]["visible_change_s"] is not None
    assert list(paths.logs.glob("doctor-*.out")), "the job's output stays in the run's logs/"
