"""A regular (non-editable) wheel carries the handlers and every template."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_templates_and_handlers(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("hpc_rollout-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    expected_templates = sorted(p.name for d in ("sbatch", "images", "orchestrator/report") for p in (ROOT / d).glob("*.j2"))
    packaged = sorted(Path(n).name for n in names if n.endswith(".j2"))
    assert expected_templates and packaged == expected_templates
    for module in ("orchestrator/worker/engine.py", "handlers/echo.py", "handlers/sleep.py", "orchestrator/cli/__init__.py"):
        assert module in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "hpc-rollout = orchestrator.cli:main" in text and "[hpc_rollout.handlers]" in text
