"""The project's own import graph, read statically from the source (nothing is imported).

    python -m scripts.import_graph             # package-level edges, cycles, upward imports
    python -m scripts.import_graph --mermaid   # the same graph as a Mermaid block (docs/architecture.md)
    python -m scripts.import_graph --json      # one JSON object (edges, cycles, violations)

A "package" is one directory under orchestrator/ (orchestrator.llm, orchestrator.worker, ...);
the modules directly in orchestrator/ form the package `core`; `handlers/` (installed as hpc_rollout.handlers) is one package.
Imports inside functions count too: a lazy import is still a dependency. Imports under
`if TYPE_CHECKING:` do not (they never run); a layer may name a type from above in annotations.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Source folders and the import name each installs as (setup.py maps handlers/ under hpc_rollout).
ROOTS = {"orchestrator": "orchestrator", "handlers": "hpc_rollout.handlers"}

# Layers, bottom to top: a package may import only packages of its own layer or below.
# Within one layer, imports are allowed as long as they form no cycle. A package is a folder;
# its place in this list is its layer (docs/architecture.md has one line per package).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),                                       # orchestrator/*.py: the error base, run.toml
    ("spool",),                                      # the file protocol: paths, tickets, claims, shards, leases
    ("sandbox", "llm"),                              # what a stage drives: sandboxes, LLM backends (client side)
    ("handler_api", "agent", "grading", "proxy", "report", "devserver"),  # what handlers see; run readers; the reference LLM server
    ("worker", "metrics", "submission"),             # the stage worker and its hooks; queueing tasks
    ("handlers", "slurm", "doctor"),                 # task plugins; Slurm arrays of workers; the filesystem's doctor
    ("trainer",),                                    # what a trainer imports: API, reader, batches, sampler, verl
    ("app",),                                        # demo, local launching, tasks check
    ("cli",),                                        # the command line, on top of everything
)


@dataclass(frozen=True)
class ImportEdge:
    source_module: str
    target_module: str
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([ROOTS[parts[0]], *parts[1:]])


def _source_path(dotted: str) -> Path | None:
    """The file or folder of an import name of ours (without .py / __init__.py), None otherwise."""
    for folder, name in ROOTS.items():
        if dotted == name or dotted.startswith(name + "."):
            return REPO.joinpath(folder, *dotted[len(name) + 1:].split(".")) if dotted != name else REPO / folder
    return None


def package_of(module: str) -> str:
    if module == ROOTS["handlers"] or module.startswith(ROOTS["handlers"] + "."):
        return "handlers"
    parts = module.split(".")
    if len(parts) >= 2 and (REPO / parts[0] / parts[1]).is_dir():
        return parts[1]
    return "core"


def source_files() -> list[Path]:
    files: list[Path] = []
    for root in ROOTS:
        files.extend(p for p in sorted((REPO / root).rglob("*.py")) if "__pycache__" not in p.parts)
    return files


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`: names for annotations, never run."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            hidden.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return hidden


def imports_of(path: Path) -> list[ImportEdge]:
    """Imports that run (at module level or inside functions); type-checking-only ones are left out."""
    module = module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    type_only = _type_checking_only(tree)
    edges: list[ImportEdge] = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = _resolve_relative(module, path.name == "__init__.py", node.level, node.module)
            # `from pkg import submodule` depends on the submodule, not on what pkg/__init__ defines.
            submodules = [f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")]
            targets = submodules if len(submodules) == len(node.names) else [base, *submodules]
        for target in targets:
            if _source_path(target) is not None:
                edges.append(ImportEdge(module, target, node.lineno))
    return edges


def _is_module(dotted: str) -> bool:
    path = _source_path(dotted)
    return path is not None and (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file())


def all_edges() -> list[ImportEdge]:
    return [edge for path in source_files() for edge in imports_of(path)]


def package_edges(edges: list[ImportEdge]) -> dict[tuple[str, str], list[ImportEdge]]:
    grouped: dict[tuple[str, str], list[ImportEdge]] = {}
    for edge in edges:
        source, target = package_of(edge.source_module), package_of(edge.target_module)
        if source != target:
            grouped.setdefault((source, target), []).append(edge)
    return grouped


def cycles(nodes: set[str], arcs: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan), each sorted."""
    successors: dict[str, list[str]] = {node: [] for node in nodes}
    for source, target in arcs:
        successors.setdefault(source, []).append(target)
        successors.setdefault(target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in successors[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for node in sorted(successors):
        if node not in index:
            visit(node)
    return sorted(components)


def layer_of(package: str) -> int:
    for level, members in enumerate(LAYERS):
        if package in members:
            return level
    raise KeyError(f"package {package!r} has no layer in scripts/import_graph.py LAYERS; "
                   f"add it to one of {[list(m) for m in LAYERS]}")


def upward_imports(edges: list[ImportEdge]) -> list[ImportEdge]:
    return [edge for edge in edges
            if layer_of(package_of(edge.target_module)) > layer_of(package_of(edge.source_module))]


def summary() -> dict[str, object]:
    edges = all_edges()
    by_package = package_edges(edges)
    packages = {package_of(module_name(p)) for p in source_files()}
    modules = {module_name(p) for p in source_files()}
    module_arcs = {(e.source_module, e.target_module) for e in edges
                   if e.target_module in modules and e.source_module != e.target_module}
    return {
        "packages": sorted(packages),
        "package_edges": sorted(f"{s} -> {t}" for s, t in by_package),
        "package_cycles": cycles(packages, set(by_package)),
        "module_cycles": cycles(modules, module_arcs),
        "upward_imports": [f"{e.source_module}:{e.line} -> {e.target_module}" for e in upward_imports(edges)],
    }


def mermaid() -> str:
    by_package = package_edges(all_edges())
    lines = ["```mermaid", "flowchart BT"]
    for level, members in enumerate(LAYERS):
        lines.append(f"  subgraph L{level}[\"layer {level}\"]")
        lines.extend(f"    {member}" for member in members)
        lines.append("  end")
    lines.extend(f"  {s} --> {t}" for s, t in sorted(by_package))
    lines.append("```")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--mermaid", action="store_true", help="print the package graph as Mermaid")
    args = parser.parse_args(argv)
    if args.mermaid:
        print(mermaid())
        return 0
    info = summary()
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"packages ({len(info['packages'])}): {', '.join(info['packages'])}")
    print(f"package edges ({len(info['package_edges'])}):")
    for edge in info["package_edges"]:
        print(f"  {edge}")
    print(f"package cycles ({len(info['package_cycles'])}): {info['package_cycles']}")
    print(f"module cycles ({len(info['module_cycles'])}): {info['module_cycles']}")
    print(f"upward imports ({len(info['upward_imports'])}):")
    for line in info["upward_imports"]:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
