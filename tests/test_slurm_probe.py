"""The Slurm tests ask the cluster for what they need: a cluster of another shape, or none at all
(even as root), skips them with a reason naming the need; where the project's cluster is required
(scripts/test.sh as root sets HPC_ROLLOUT_SLURM_REQUIRED) the same test fails instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.slurm_probe import REQUIRED_ENV, Cluster, Needs, Partition

REPO = Path(__file__).resolve().parents[1]
A_SLURM_TEST = "tests/slurm/test_launch_slurm.py::test_launch_wait_returns_when_drained_with_no_task_left"


def small_cluster() -> Cluster:
    debug = Partition("batch", frozenset({"n1", "n2"}), default=True, priority_tier=1)
    return Cluster(partitions={"batch": debug}, cpus={"n1": 4, "n2": 4}, gpus={"n1": 0, "n2": 0},
                   max_array_size=1001, preempt_type="preempt/none", preempt_mode="OFF", accounting=False)


def test_each_missing_need_is_named_with_what_the_cluster_has() -> None:
    cluster = small_cluster()
    assert Needs(nodes=2).unmet(cluster) == []
    assert Needs(nodes=4).unmet(cluster) == ["4 usable nodes in partition batch (it has 2)"]
    assert Needs(partition="high").unmet(cluster) == ["a partition 'high' (the cluster has batch)"]
    (gpus,) = Needs(gpus_per_node=1).unmet(cluster)
    assert "gres gpu:1" in gpus and "found on 0" in gpus
    (array,) = Needs(max_array_size=(2, 16)).unmet(cluster)
    assert "MaxArraySize between 2 and 16 (it is 1001)" == array
    (preemption,) = Needs(preemption=True).unmet(cluster)
    assert "PreemptType=preempt/partition_prio" in preemption and "PreemptType=preempt/none" in preemption
    assert Needs(accounting=True, cpus=9).unmet(cluster) == ["9 CPUs in partition batch (it has 8)",
                                                            "accounting (sacct, slurmdbd)"]


def test_a_higher_tier_partition_over_the_same_nodes_is_found_for_preemption() -> None:
    nodes = frozenset({"n1", "n2"})
    low, high = Partition("debug", nodes, True, 1), Partition("high", nodes, False, 10)
    cluster = Cluster({"debug": low, "high": high}, {}, {}, 8, "preempt/partition_prio", "REQUEUE", True)
    assert cluster.preempting_partition(low) == high and cluster.preempting_partition(high) is None
    assert Needs(preemption=True).unmet(cluster) == []


def run_slurm_test(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != REQUIRED_ENV}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-rs",
                           "-q", A_SLURM_TEST], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**clean, **env})


def test_without_a_cluster_slurm_tests_skip_even_as_root(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    no_client = run_slurm_test(tmp_path, PATH=str(tmp_path / "bin"))
    assert no_client.returncode == 0 and "1 skipped" in no_client.stdout, no_client.stdout + no_client.stderr
    assert "no Slurm client on PATH" in no_client.stdout and "slurm-up.sh" in no_client.stdout

    (tmp_path / "slurm.conf").write_text("")   # a client, but no controller to talk to
    no_controller = run_slurm_test(tmp_path, SLURM_CONF=str(tmp_path / "slurm.conf"))
    assert no_controller.returncode == 0 and "1 skipped" in no_controller.stdout, no_controller.stdout
    assert "controller is down" in no_controller.stdout or "does not answer" in no_controller.stdout


def test_where_the_cluster_is_required_a_missing_one_fails(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    required = run_slurm_test(tmp_path, PATH=str(tmp_path / "bin"), **{REQUIRED_ENV: "1"})
    # (pytest.fail in the fixture: reported as an error of the test's setup)
    assert required.returncode != 0 and "1 error" in required.stdout, required.stdout + required.stderr
    assert REQUIRED_ENV in required.stdout and "no Slurm client on PATH" in required.stdout
