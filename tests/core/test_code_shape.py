"""The code stays in pieces a reader can hold: no class over MAX_CLASS_LINES, no function over
MAX_FUNCTION_LINES in orchestrator/ and handlers/, and no two classes of orchestrator/ with one
name (two `WorkerState`s that mean different things: issue 38).

Static and fast: the sources are read with ast, nothing is imported. Lines are counted from a
definition's first line (its decorators excluded) to its last, docstring and comments included.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 80
ROOTS = ("orchestrator", "handlers")
# Names two classes still share, with why: a name user code imports (the handler API) beside one
# that follows a naming rule of its own. Rename one of the pair, then remove it from here.
SHARED_NAMES = {
    "Sandbox": "config.py's [sandbox] section (each section class is named after its run.toml section) and "
               "sandbox/base.py's runtime, which users' handlers name",
}

Definition = tuple[str, str, int]   # "path:line", name, lines


def definitions(tree: ast.AST, path: str) -> Iterator[tuple[ast.AST, Definition]]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, (f"{path}:{node.lineno}", node.name, (node.end_lineno or node.lineno) - node.lineno + 1)


@functools.cache
def sources() -> tuple[tuple[str, ast.Module], ...]:
    """Every module of ROOTS, parsed once for the tests of this module."""
    return tuple((str(path.relative_to(REPO)), ast.parse(path.read_text(), filename=str(path)))
                 for root in ROOTS for path in sorted((REPO / root).rglob("*.py")))


def too_long(modules: list[tuple[str, ast.Module]]) -> list[str]:
    found = []
    for path, tree in modules:
        for node, (where, name, lines) in definitions(tree, path):
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if lines > limit:
                found.append(f"{where} {name}: {lines} lines (at most {limit})")
    return found


def shared_class_names(modules: list[tuple[str, ast.Module]]) -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for path, tree in modules:
        if path.startswith("orchestrator/"):
            for node, (at, name, _) in definitions(tree, path):
                if isinstance(node, ast.ClassDef):
                    where[name].append(at)
    return {name: places for name, places in where.items() if len(places) > 1}


def test_no_class_or_function_is_too_long() -> None:
    found = too_long(list(sources()))
    assert not found, "split these by concept (a class) or by step (a function):\n  " + "\n  ".join(found)


def test_no_two_classes_of_the_engine_share_a_name() -> None:
    shared = {name: places for name, places in shared_class_names(list(sources())).items() if name not in SHARED_NAMES}
    assert not shared, ("classes of one name that mean different things: rename one to say what it is:\n  "
                        + "\n  ".join(f"{name}: {', '.join(places)}" for name, places in sorted(shared.items())))


def test_the_shared_names_listed_are_still_shared() -> None:
    shared = shared_class_names(list(sources()))
    assert not [name for name in SHARED_NAMES if name not in shared], "renamed: remove it from SHARED_NAMES"


def test_the_checks_see_a_long_function_and_a_shared_name() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long = ast.parse(f"def f():\n{body}\n")
    assert too_long([("orchestrator/x.py", long)]) == [f"orchestrator/x.py:1 f: {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})"]
    pair = [("orchestrator/a.py", ast.parse("class Pair:\n    pass\n")), ("orchestrator/b.py", ast.parse("class Pair:\n    pass\n"))]
    assert shared_class_names(pair) == {"Pair": ["orchestrator/a.py:1", "orchestrator/b.py:1"]}
