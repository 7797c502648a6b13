"""The docs cite tests that exist: every test file named in README.md and docs/*.md, and every
test function named after it (`file.py::name`, and robustness.md's `, ::name` chains, with its
abbreviations C/ S/ L/ F/), is there. A renamed or removed test fails here, not in a reader."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ABBREVIATIONS = {"C": "core", "S": "sandbox", "L": "llm", "F": "faults", "R": "report", "P": "proxy", "A": "agents"}   # docs/robustness.md's legend
CITATION = re.compile(r"(?:tests/)?\b([A-Za-z]+)/(test_\w+\.py)((?:::\w+(?:\[[^\]]*\])?)?(?:,\s*::\w+(?:\[[^\]]*\])?)*)")


def cited(text: str) -> list[tuple[Path, list[str]]]:
    found = []
    for match in CITATION.finditer(text):
        folder, name, tail = match.groups()
        folder = ABBREVIATIONS.get(folder, folder)
        path = REPO / "tests" / name if folder == "tests" else REPO / "tests" / folder / name
        found.append((path, re.findall(r"::(\w+)", tail)))
    return found


def test_every_cited_test_file_and_function_exists() -> None:
    missing = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for path, functions in cited(doc.read_text()):
            if not path.is_file():
                missing.append(f"{doc.name}: {path.relative_to(REPO)}")
                continue
            defined = {node.name for node in ast.walk(ast.parse(path.read_text()))
                       if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
            missing += [f"{doc.name}: {path.relative_to(REPO)}::{f}" for f in functions if f not in defined]
    assert missing == [], "\n".join(missing)


def test_the_citation_pattern_reads_both_forms() -> None:
    text = ("see `tests/proxy/test_wire.py::test_a` and C/test_poison.py::test_b, ::test_c[x]; F/test_fault_mix.py"
            " and tests/test_benchmarks.py")
    assert cited(text) == [(REPO / "tests/proxy/test_wire.py", ["test_a"]),
                           (REPO / "tests/core/test_poison.py", ["test_b", "test_c"]),
                           (REPO / "tests/faults/test_fault_mix.py", []),
                           (REPO / "tests/test_benchmarks.py", [])]


MODULE_PATH = re.compile(r"\b((?:orchestrator|handlers|benchmarks|scripts|sbatch|tests)/[\w/-]*\w\.(?:py|sh|j2))\b")
# Files whose text holds paths of another repository (the bundled SWE tasks' sources), not this one's.
NOT_OURS = ("handlers/bundled/swe_repos.py",)


def test_every_module_path_the_docs_and_docstrings_name_exists() -> None:
    """A module renamed or moved leaves no pointer to where it was: README, docs/*.md and the
    package's own docstrings and comments name only files that are there (issue 38)."""
    texts = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("scripts/*.sh"))]
    for package in ("orchestrator", "handlers", "benchmarks"):
        texts += [p for p in sorted((REPO / package).rglob("*.py")) if p.relative_to(REPO).as_posix() not in NOT_OURS]
    missing = sorted({f"{text.relative_to(REPO)}: {match}" for text in texts
                      for match in MODULE_PATH.findall(text.read_text()) if not (REPO / match).exists()})
    assert missing == [], "\n".join(missing)
