"""verl's own venv for the tests (scripts/verl-setup.sh), with this checkout on its path.

scripts/test.sh installs the venv in the background from its start; `verl_python()` waits for
that install and fails with its log's tail if it did not succeed (these tests never skip).
The venv holds verl and hpc-rollout's dependencies but not hpc-rollout: `VerlEnv.overlay` is
this checkout built into a temporary directory (`pip install --no-deps --target`, a few
seconds, from a copy of the sources so nothing is written into the checkout), put first on
PYTHONPATH of every process started in the venv: workers, the driver, the benchmark.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.background import log_tail, wait_for_background

REPO = Path(__file__).resolve().parents[2]
BACKGROUND_INSTALL_PID = "HPC_ROLLOUT_VERL_SETUP_PID"   # set by scripts/test.sh
BACKGROUND_INSTALL_LOG = "HPC_ROLLOUT_VERL_SETUP_LOG"
SOURCES = ("orchestrator", "handlers", "images", "sbatch", "setup.py", "pyproject.toml", "README.md")


def verl_python() -> Path:
    """The venv's python, after the background install of scripts/test.sh (if any) has ended."""
    wait_for_background(BACKGROUND_INSTALL_PID, "verl install")
    check_only = "1" if os.environ.get(BACKGROUND_INSTALL_PID) else "0"
    done = subprocess.run(["bash", str(REPO / "scripts" / "verl-setup.sh")], capture_output=True, text=True,
                          env={**os.environ, "VERL_SETUP_CHECK_ONLY": check_only}, timeout=3600)
    if done.returncode != 0:
        raise AssertionError(f"no verl venv:\n{done.stderr[-2000:]}\n{log_tail(BACKGROUND_INSTALL_LOG)}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class VerlEnv:
    python: Path
    overlay: Path

    def env(self, **extra: str) -> dict[str, str]:
        path = os.pathsep.join([str(self.overlay), str(REPO)])
        return {**os.environ, "PYTHONPATH": path, "PYTHONNOUSERSITE": "1", **extra}

    def run(self, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), *args], capture_output=True, text=True, env=self.env(**env),
                              timeout=timeout, cwd=str(REPO))

    def popen(self, *args: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
        handle = open(log, "wb")
        return subprocess.Popen([str(self.python), *args], stdout=handle, stderr=subprocess.STDOUT,
                                env=self.env(**env), start_new_session=True, cwd=str(REPO))


def build_overlay(python: Path, into: Path) -> Path:
    """This checkout installed (no dependencies) into `into`/site, from a copy of its sources."""
    copy, site = into / "src", into / "site"
    copy.mkdir(parents=True)
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "out"))
        else:
            shutil.copy2(source, copy / name)
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(site), str(copy)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"could not install this checkout into the verl venv's overlay:\n{done.stderr[-2000:]}")
    return site


def verl_env(into: Path) -> VerlEnv:
    python = verl_python()
    return VerlEnv(python, build_overlay(python, into))


if __name__ == "__main__":   # print the venv's python (after waiting for a background install)
    print(verl_python(), file=sys.stdout)
