"""submitit's private names live in one adapter, checked against the version range pyproject pins."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from orchestrator.slurm import submitit_adapter
from orchestrator.slurm.launcher import render_script
from orchestrator.slurm.options import LaunchOptions

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_submitit_is_the_range_the_adapter_was_checked_against() -> None:
    checked = SpecifierSet(submitit_adapter.CHECKED_RANGE)
    assert Version(importlib.metadata.version("submitit")) in checked
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = next(Requirement(r) for r in project["dependencies"] if Requirement(r).name == "submitit")
    assert declared.specifier == checked


def test_only_the_adapter_touches_submitit_internals() -> None:
    public = {"submitit", "submitit.helpers"}
    offenders = []
    for path in (ROOT / "orchestrator").rglob("*.py"):
        if path.name == "submitit_adapter.py":
            continue
        for module in re.findall(r"^\s*(?:from|import) (submitit[\w.]*)", path.read_text(), re.MULTILINE):
            if module not in public:
                offenders.append(f"{path.relative_to(ROOT)}: {module}")
        if re.search(r"\._(make_submission_file_text|submitit_command_str)\b|USR_SIG\b", path.read_text()):
            offenders.append(f"{path.relative_to(ROOT)}: private submitit attribute")
    assert not offenders, offenders


def test_the_offline_executor_renders_an_array_script_without_srun(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PATH", "/nonexistent")   # no srun, no sbatch: rendering must not need them
    script = render_script(tmp_path, LaunchOptions(nodes=4, signal="USR1", signal_delay_s=60), 4)
    assert script.startswith("#!/bin/bash")
    assert "#SBATCH --array=0-3%4" in script
    assert "#SBATCH --signal=USR1@60" in script
    assert "submitit.core._submit" in script
