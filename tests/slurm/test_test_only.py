"""Every rendered script, and launch's dry-run script, passes `sbatch --test-only` on the real cluster."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.slurm.launcher import render_script
from orchestrator.slurm.options import LaunchOptions
from orchestrator.slurm.templates import render
from orchestrator.slurm.cluster import max_array_size
from tests.slurm.cases import CASES
from tests.slurm_probe import Cluster, require


def _test_only(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=30)


def needs_of(values: dict[str, object]) -> dict[str, object]:
    """What a golden case asks of the cluster: its partition and its GPUs per node."""
    gpus = int(str(values.get("gpus_per_node") or values.get("gpus") or 0))
    return {"partition": values.get("partition"), "gpus_per_node": gpus}


@pytest.mark.slurm
@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_template_passes_sbatch_test_only(case: str, tmp_path: Path) -> None:
    name, values = CASES[case]
    require(**needs_of(values))
    # Only the log folder must point somewhere real; the golden files keep their paths.
    script = tmp_path / f"{case}.sbatch"
    script.write_text(render(name, {**values, "log_dir": str(tmp_path)}))
    done = _test_only(script)
    assert done.returncode == 0, done.stderr
    assert "to start at" in done.stderr


@pytest.mark.slurm(gpus_per_node=1)
def test_launch_dry_run_script_passes_sbatch_test_only(slurm_cluster: Cluster, tmp_path: Path) -> None:
    options = LaunchOptions(nodes=4, partition=slurm_cluster.default_partition.name, time="00:30:00", cpus_per_node=2, mem="1G",
                            gpus_per_node=1, setup=("echo ready",), sbatch=(("comment", "rollouts"),))
    script = tmp_path / "array.sbatch"
    script.write_text(render_script(tmp_path, options, 4))
    done = _test_only(script)
    assert done.returncode == 0, done.stderr


@pytest.mark.slurm
def test_test_only_rejects_what_the_cluster_cannot_run(tmp_path: Path) -> None:
    # The check is real: a partition the cluster lacks is refused.
    script = tmp_path / "bad.sbatch"
    script.write_text(render("worker", {"partition": "nosuchpartition", "log_dir": str(tmp_path)}))
    assert _test_only(script).returncode != 0


@pytest.mark.slurm
def test_render_warns_when_the_array_exceeds_max_array_size(tmp_path: Path) -> None:
    # MaxArraySize=M (8 with scripts/slurm-up.sh): indices 0..M-1 pass, 0..M are refused, and render says so.
    limit = max_array_size()
    runner = CliRunner()
    fits = runner.invoke(cli, ["sbatch", "render", "worker", "--set", f"nodes={limit}", "--set", f"log_dir={tmp_path}"])
    assert fits.exit_code == 0 and "MaxArraySize" not in fits.stderr
    too_big = runner.invoke(cli, ["sbatch", "render", "worker", "--set", f"nodes={limit + 1}", "--set",
                                  f"log_dir={tmp_path}", "-o", str(tmp_path / "over.sbatch")])
    assert too_big.exit_code == 0
    assert f"MaxArraySize is {limit}" in too_big.stderr and f"launch --nodes {limit + 1}" in too_big.stderr
    assert _test_only(tmp_path / "over.sbatch").returncode != 0, "sbatch refuses it, as warned"
