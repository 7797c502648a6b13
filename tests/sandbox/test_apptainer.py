"""Apptainer/Singularity up to its process boundary: a stand-in binary records argv."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from orchestrator.spool.paths import SpoolPaths
from orchestrator.sandbox import apptainer
from orchestrator.sandbox.start import resolve_runtime, start_sandbox
from orchestrator.sandbox.errors import SandboxConfigError, SandboxStartError
from orchestrator.sandbox.options import SandboxOptions
from orchestrator.sandbox.records import sandboxes_dir
from orchestrator.sandbox.spec import PTYPROCESS_PACKAGE, SERVER_PACKAGE, LaunchSpec
from tests.sandbox.helpers import run

STAND_IN = """#!{python}
import json, os, sys
with open(os.environ.get("ARGV_LOG", "/dev/null"), "a") as fh:
    fh.write(json.dumps(sys.argv) + "\\n")
sys.stderr.write("stand-in apptainer: not a real container runtime\\n")
sys.exit(255)
"""


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("ARGV_LOG", str(log))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


def _install(bin_dir: Path, name: str) -> None:
    path = bin_dir / name
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(0o755)


def _spec(tmp_path: Path, **options: object) -> LaunchSpec:
    image = tmp_path / "python.sif"
    image.write_text("sif")
    return LaunchSpec(
        sandbox_id="abc123", job_id="j-000001-000", runtime_dir=tmp_path / "rt",
        socket_dir=tmp_path / "rt" / "s", workspace=tmp_path / "ws",
        options=SandboxOptions.parse(image=str(image), **options), loopback="127.9.9.9",
    )


def _expected_tail(tmp_path: Path) -> list[str]:
    tail = ["--env-file", f"{tmp_path}/rt/apptainer.env"]
    boot = ("import sys; sys.path[:0] = ['/.hpc-rollout/py']; "
            "from server.exec_server import main; main()")
    return tail + [str(tmp_path / "python.sif"), "python3", "-E", "-s", "-B", "-c", boot]


def _expected_binds(tmp_path: Path) -> list[str]:
    return [
        "--pwd", "/workspace",
        "--bind", f"{tmp_path}/ws:/workspace:rw",
        "--bind", f"{tmp_path}/rt/s:/.hpc-rollout/run:rw",
        "--bind", f"{SERVER_PACKAGE}:/.hpc-rollout/py/server:ro",
        "--bind", f"{PTYPROCESS_PACKAGE}:/.hpc-rollout/py/ptyprocess:ro",
    ]


def test_default_argv_isolates_network_and_environment(tmp_path: Path) -> None:
    argv = apptainer.build_argv(_spec(tmp_path), binary="apptainer")
    assert argv == [
        "apptainer", "exec", "--containall", "--no-home", "--cleanenv",
        "--net", "--network", "none", "--writable-tmpfs",
        *_expected_binds(tmp_path), *_expected_tail(tmp_path),
    ]


def test_network_on_fakeroot_binds_and_env(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    argv = apptainer.build_argv(
        _spec(tmp_path, network=True, fakeroot=True, binds=[f"{data}:/data", f"{data}:/out:rw"],
              env={"TASK": "x"}),
        binary="singularity",
    )
    assert argv == [
        "singularity", "exec", "--containall", "--no-home", "--cleanenv",
        "--writable-tmpfs", "--fakeroot", *_expected_binds(tmp_path),
        "--bind", f"{data}:/data:ro", "--bind", f"{data}:/out:rw",
        *_expected_tail(tmp_path),
    ]
    assert "--net" not in argv and "--network" not in argv


def test_env_file_keeps_commas_quotes_and_no_host_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    spec = _spec(tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,1", "QUOTE": "it's"})
    spec.runtime_dir.mkdir()
    apptainer.write_env_file(spec)
    text = apptainer.env_file(spec).read_text()
    assert "CUDA_VISIBLE_DEVICES='0,1'\n" in text and "QUOTE='it'\\''s'\n" in text
    assert "HPC_ROLLOUT_LOOPBACK='127.9.9.9'" in text and "SLURM" not in text and "PATH=" not in text
    import subprocess

    sourced = subprocess.run(["bash", "-c", f"set -a; . {apptainer.env_file(spec)}; echo \"$QUOTE|$CUDA_VISIBLE_DEVICES\""],
                             capture_output=True, text=True).stdout
    assert sourced == "it's|0,1\n"


def test_either_binary_name_is_found(stand_in: Path) -> None:
    assert apptainer.find_apptainer() is None or not str(apptainer.find_apptainer()).startswith(str(stand_in))
    _install(stand_in, "singularity")
    assert apptainer.find_apptainer() == str(stand_in / "singularity")
    _install(stand_in, "apptainer")
    assert apptainer.find_apptainer() == str(stand_in / "apptainer")  # preferred
    assert resolve_runtime("auto") == "apptainer"


def test_start_runs_the_exact_command_line_and_cleans_up(stand_in: Path, tmp_path: Path) -> None:
    _install(stand_in, "apptainer")
    image = tmp_path / "img.sif"
    image.write_text("sif")
    spool = SpoolPaths.of(tmp_path / "spool")

    async def scenario() -> None:
        with pytest.raises(SandboxStartError, match="stand-in apptainer"):
            await start_sandbox("auto", job_id="a-000001-000", paths=spool, image=str(image))

    run(scenario())
    recorded = [json.loads(line) for line in Path(os.environ["ARGV_LOG"]).read_text().splitlines()]
    assert len(recorded) == 1
    argv = recorded[0]
    assert argv[0] == str(stand_in / "apptainer")
    assert argv[1:9] == ["exec", "--containall", "--no-home", "--cleanenv", "--net", "--network", "none",
                         "--writable-tmpfs"]
    assert str(image) in argv and argv[argv.index(str(image)) + 1] == "python3"
    assert list(sandboxes_dir().iterdir()) == []


def test_missing_binary_and_missing_image_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxConfigError, match="module load apptainer"):
        apptainer.require_apptainer()
    spec = LaunchSpec("x", "j", tmp_path, tmp_path, tmp_path, SandboxOptions.parse(), "127.1.1.1")
    with pytest.raises(SandboxConfigError, match="needs an image"):
        apptainer.build_argv(spec)


BUILD_STAND_IN = """#!{python}
import json, os, sys
with open(os.environ["ARGV_LOG"], "a") as fh:
    fh.write(json.dumps(sys.argv) + "\\n")
if sys.argv[1:3] == ["build", "--fakeroot"]:
    with open(sys.argv[3], "w") as out:
        out.write("SIF built from " + open(sys.argv[4]).read().splitlines()[0])
"""


def test_image_build_sif_runs_apptainer_build_fakeroot(stand_in: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from orchestrator.cli import cli

    script = stand_in / "apptainer"
    script.write_text(BUILD_STAND_IN.format(python=sys.executable))
    script.chmod(0o755)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["image", "build", "python", "--out", str(out),
                                      "--set", "bootstrap=docker"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("built ") and "(scratch" in result.output
    argv = json.loads(Path(os.environ["ARGV_LOG"]).read_text().splitlines()[-1])
    images = sorted(out.glob("python-versioned-*.sif"))
    assert len(images) == 1 and images[0].read_text() == "SIF built from Bootstrap: docker"
    assert argv[:3] == [str(script), "build", "--fakeroot"]
    assert Path(argv[3]).parent == out and Path(argv[3]).name.startswith(".python-versioned-")
    assert argv[4] == str(images[0]).removesuffix(".sif") + ".sif.def" and len(argv) == 5
    again = CliRunner().invoke(cli, ["image", "build", "python", "--out", str(out), "--set", "bootstrap=docker"])
    assert again.output.startswith("reused ")
