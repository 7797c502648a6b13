"""A third-party program the proxy tests run in sandboxes (mini_swe_agent.py, verifiers_venv.py),
pip-installed once into a virtualenv of the system python3 in the cache, and the wait for the
background install of scripts/test.sh (`python -m tests.proxy.<module>`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.background import log_tail, wait_for_background

SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class CachedVenv:
    requirement: str       # what pip installs, e.g. "verifiers==0.4.0"
    directory: str         # its folder in $HPC_ROLLOUT_CACHE/harness (default ~/.cache/hpc-rollout/harness)
    override: str          # an environment variable naming a venv made elsewhere
    program: str           # bin/PROGRAM shows that such a venv is usable
    pid_variable: str      # set by scripts/test.sh: the background install's pid and log
    log_variable: str

    def path(self) -> Path:
        configured = os.environ.get(self.override)
        if configured:
            return Path(configured)
        base = os.environ.get("HPC_ROLLOUT_CACHE")
        return (Path(base) if base else Path.home() / ".cache" / "hpc-rollout") / "harness" / self.directory

    def ensure(self) -> Path:
        """The venv, installed now when missing: built in place (a venv cannot be moved after it is
        made) and marked complete (`.complete`) last."""
        venv = self.path()
        if (venv / ".complete").exists() or (os.environ.get(self.override) and (venv / "bin" / self.program).exists()):
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True, timeout=300)
        done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", self.requirement],
                              capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"pip install {self.requirement} failed: {done.stderr[-2000:]}")
        (venv / ".complete").write_text(self.requirement + "\n")
        return venv

    def for_tests(self) -> Path:
        """The venv once the background install (if any) has ended; a failure is an
        AssertionError carrying the end of that install's log."""
        wait_for_background(self.pid_variable, f"{self.requirement} install")
        try:
            return self.ensure()
        except Exception as error:
            raise AssertionError(f"no {self.requirement}: {error}\n{log_tail(self.log_variable)}") from error
