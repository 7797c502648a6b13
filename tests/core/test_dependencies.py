"""pyproject.toml says true things: the Python it needs, ranges that hold what we test with, no
test tool at run time, and a one-line error naming the extra when torch is missing."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement
from packaging.version import Version

from orchestrator.cli import cli

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_requires_python_covers_what_the_code_calls() -> None:
    # worker/stages.py calls asyncio.Task.uncancel() (3.11+); config.py imports tomllib (3.11+).
    assert "uncancel()" in (ROOT / "orchestrator/worker/stages.py").read_text()
    assert PROJECT["requires-python"] == ">=3.11"


def test_pytest_is_a_test_extra_not_a_runtime_dependency() -> None:
    runtime = {Requirement(r).name for r in PROJECT["dependencies"]}
    assert "pytest" not in runtime
    assert "pytest" in {Requirement(r).name for r in PROJECT["optional-dependencies"]["test"]}


@pytest.mark.parametrize("requirement", PROJECT["dependencies"] + PROJECT["optional-dependencies"]["llm"])
def test_installed_versions_lie_in_the_declared_ranges(requirement: str) -> None:
    parsed = Requirement(requirement)
    if parsed.marker is not None and not parsed.marker.evaluate():
        pytest.skip(f"{requirement}: not for this Python")
    installed = Version(importlib.metadata.version(parsed.name))
    # A local label (torch 2.13.0+cpu) is the same release for the range check.
    assert parsed.specifier.contains(Version(installed.public), prereleases=True), (
        f"{parsed.name} {installed} is outside {parsed.specifier}: widen the range after testing it")


@pytest.mark.parametrize("command", [["serve-llm", "--tiny", "--port", "0"], ["demo"]])
def test_missing_torch_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)   # `import torch` now raises ImportError
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "hpc-rollout[llm]" in lines[0] and "download.pytorch.org/whl/cpu" in lines[0]


OPTIONAL = ("torch", "prometheus_client", "wandb", "tensorboard", "math_verify", "spython")


def _cli_help_without(blocked: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    code = ("import sys\n"
            f"for name in {blocked!r}: sys.modules[name] = None\n"
            "from orchestrator.cli import main\nsys.argv = ['hpc-rollout', '--help']\nmain()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_every_command_group_loads_without_the_optional_extras() -> None:
    done = _cli_help_without(OPTIONAL)
    assert done.returncode == 0 and not done.stderr, done.stderr
    for command in ("submit", "status", "serve-llm", "demo", "report", "sandbox", "sbatch"):
        assert f"  {command}" in done.stdout


def test_a_command_group_that_cannot_be_imported_is_not_hidden() -> None:
    done = _cli_help_without(("orchestrator.cli.report",))
    assert done.returncode != 0
    assert "import of orchestrator.cli.report" in done.stderr, done.stderr
