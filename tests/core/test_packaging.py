"""A regular (non-editable) wheel carries the handlers and every template, and claims no generic
top-level import name: handlers/, images/ and sbatch/ install as hpc_rollout.handlers,
hpc_rollout.images and hpc_rollout.sbatch."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from scripts import import_graph

ROOT = Path(__file__).resolve().parents[2]
RELOCATED = ("handlers", "images", "sbatch")   # folders of the repository, installed under hpc_rollout


def test_wheel_contains_templates_and_handlers_under_one_namespace(tmp_path: Path) -> None:
    # Built from a copy of the sources: setuptools builds in <source>/build/, and a build/ left by
    # an older layout would slip its packages into the wheel (and the test would dirty the checkout).
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "spool"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("hpc_rollout-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    expected_templates = sorted(p.name for d in ("sbatch", "images", "orchestrator/report") for p in (ROOT / d).glob("*.j2"))
    packaged = sorted(Path(n).name for n in names if n.endswith(".j2"))
    assert expected_templates and packaged == expected_templates
    for module in ("orchestrator/worker/engine.py", "hpc_rollout/handlers/echo.py", "hpc_rollout/handlers/bundled/write.py",
                   "hpc_rollout/sbatch/worker.sbatch.j2", "hpc_rollout/images/defaults.txt", "orchestrator/cli/__init__.py"):
        assert module in names
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top_level == {"orchestrator", "hpc_rollout"}
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "hpc-rollout = orchestrator.cli:main" in text and "echo = hpc_rollout.handlers.echo:EchoHandler" in text


def test_no_code_imports_the_repository_folders_by_their_generic_names() -> None:
    sources = [*import_graph.source_files(), *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]
    generic = [f"{path.relative_to(ROOT)}: {name}" for path in sources for name in _imported_names(path)
               if name.split(".")[0] in RELOCATED]
    assert not generic, "import them as hpc_rollout.<name>:\n" + "\n".join(generic)


def _imported_names(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names
