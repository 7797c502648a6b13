"""The package layering holds: no upward import, no cycle between packages or modules.

Static and fast: the imports are read with ast by scripts/import_graph.py (nothing is imported).
The layers and their reasons are in scripts/import_graph.py LAYERS and docs/architecture.md.
"""

from __future__ import annotations

import ast

from scripts import import_graph


def test_no_package_imports_a_package_of_a_higher_layer() -> None:
    upward = import_graph.upward_imports(import_graph.all_edges())
    assert not upward, "upward imports (move the code down or the import up; see docs/architecture.md):\n" + "\n".join(
        f"  {e.source_module}:{e.line} -> {e.target_module}" for e in upward)


def test_every_package_has_a_layer() -> None:
    for package in {import_graph.package_of(import_graph.module_name(p)) for p in import_graph.source_files()}:
        import_graph.layer_of(package)   # KeyError naming the valid layers otherwise


def test_no_cycles_between_packages_or_modules() -> None:
    info = import_graph.summary()
    assert info["package_cycles"] == [], "packages importing each other (move the shared part down a layer)"
    assert info["module_cycles"] == [], ("modules importing each other, lazily or not (move what both "
                                         f"need into a module below them): {info['module_cycles']}")


def test_the_checker_sees_an_upward_import() -> None:
    edge = import_graph.ImportEdge("orchestrator.spool.paths", "orchestrator.worker.engine", 1)
    assert import_graph.upward_imports([edge]) == [edge]
    assert import_graph.cycles({"a", "b", "c"}, {("a", "b"), ("b", "a"), ("b", "c")}) == [["a", "b"]]


def test_the_verl_package_is_a_leaf_of_the_trainer() -> None:
    # verl is an optional extra: what a trainer without it imports (batches, their verl key names in
    # trainer/verl_keys.py) must not live under trainer/verl/. Type-only imports count too.
    leaf = "orchestrator.trainer.verl"
    inside = [p for p in import_graph.source_files() if import_graph.module_name(p).startswith(leaf)]
    into = []
    for path in set(import_graph.source_files()) - set(inside):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            into += [f"{path}:{node.lineno}" for name in names if name == leaf or name.startswith(leaf + ".")]
    assert inside and not into, f"imports into trainer/verl/ from outside it (move what they need out): {into}"
