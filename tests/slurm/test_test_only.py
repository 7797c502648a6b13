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
from tests.slurm.cases import CASES


def _test_only(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=30)


@pytest.mark.slurm
@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_template_passes_sbatch_test_only(case: str, slurm_cluster: None, tmp_path: Path) -> None:
    name, values = CASES[case]
    # Only the log folder must point somewhere real; the golden files keep their paths.
    script = tmp_path / f"{case}.sbatch"
    script.write_text(render(name, {**values, "log_dir": str(tmp_path)}))
    done = _test_only(script)
    assert done.returncode == 0, done.stderr
    assert "to start at" in done.stderr


@pytest.mark.slurm
def test_launch_dry_run_script_passes_sbatch_test_only(slurm_cluster: None, tmp_path: Path) -> None:
    options = LaunchOptions(nodes=4, partition="debug", time="00:30:00", cpus_per_node=2, mem="1G",
                            gpus_per_node=1, setup=("echo ready",), sbatch=(("comment", "rollouts"),))
    script = tmp_path / "array.sbatch"
    script.write_text(render_script(tmp_path, options, 4))
    done = _test_only(script)
    assert done.returncode == 0, done.stderr


@pytest.mark.slurm
def test_test_only_rejects_what_the_cluster_cannot_run(slurm_cluster: None, tmp_path: Path) -> None:
    # The check is real: a partition the cluster lacks is refused.
    script = tmp_path / "bad.sbatch"
    script.write_text(render("worker", {"partition": "nosuchpartition", "log_dir": str(tmp_path)}))
    assert _test_only(script).returncode != 0


@pytest.mark.slurm
def test_render_warns_when_the_array_exceeds_max_array_size(slurm_cluster: None, tmp_path: Path) -> None:
    # scripts/slurm-up.sh sets MaxArraySize=8: indices 0-7 pass, 0-8 are refused, and render says so.
    runner = CliRunner()
    fits = runner.invoke(cli, ["sbatch", "render", "worker", "--set", "nodes=8", "--set", f"log_dir={tmp_path}"])
    assert fits.exit_code == 0 and "MaxArraySize" not in fits.stderr
    too_big = runner.invoke(cli, ["sbatch", "render", "worker", "--set", "nodes=9", "--set", f"log_dir={tmp_path}",
                                  "-o", str(tmp_path / "nine.sbatch")])
    assert too_big.exit_code == 0
    assert "MaxArraySize is 8" in too_big.stderr and "launch --nodes 9" in too_big.stderr
    assert _test_only(tmp_path / "nine.sbatch").returncode != 0, "sbatch refuses it, as warned"
