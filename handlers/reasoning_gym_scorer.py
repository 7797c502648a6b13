"""One reasoning-gym `score_answer` call, as the scorer sandbox runs it (its text is uploaded and run
by orchestrator/grading/scorer_runner.py: the standard library and reasoning-gym only, nothing of ours).

The entry is generated again here, from the row, so that the scorer sees it with its own Python
types (a JSON copy turns arc_agi's tuple grids into lists, which its scorer then fails). A few
generators iterate over sets of strings, whose order depends on the process's hash seed
(isomorphic_strings, knight_swap, polynomial_multiplication, ransom_note in 0.1.25): when the
entry made here asks another question than the one the model was asked, the entry INIT made
(carried as JSON) is scored instead.

Only the dataset's own module is imported when it can be: `import reasoning_gym` imports all 106
generators, matplotlib among them (seconds, and a font cache that a fresh sandbox builds anew).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any


def _dataset_class_module(module: str) -> None:
    """Import `module` of reasoning_gym without running its parent packages' __init__ (bare
    packages stand in for them); an import that fails that way is done the ordinary way."""
    found = importlib.util.find_spec("reasoning_gym")
    if found is None or not found.submodule_search_locations:
        raise ImportError("reasoning_gym is not installed in the worker's Python")
    root = list(found.submodule_search_locations)[0]
    parts = module.split(".")
    try:
        for depth in range(1, len(parts)):
            package = types.ModuleType(".".join(parts[:depth]))
            package.__path__ = ["/".join([root, *parts[1:depth]])]
            sys.modules[package.__name__] = package
        importlib.import_module(module)
    except Exception:   # a module that needs its package's __init__ (circular imports otherwise)
        for name in [n for n in sys.modules if n == "reasoning_gym" or n.startswith("reasoning_gym.")]:
            del sys.modules[name]
        importlib.import_module("reasoning_gym")


def score(dataset: str, module: str, seed: int, size: int, index: int, options: dict[str, Any], question: str,
          entry: dict[str, Any], answer: str, light: bool = True) -> dict[str, Any]:
    """{"score": the dataset's score_answer(answer, entry), "entry": "rebuilt" | "carried"}."""
    if light and "reasoning_gym.factory" not in sys.modules:
        _dataset_class_module(module)
    from reasoning_gym.factory import create_dataset

    made = create_dataset(dataset, seed=seed, size=size, **options)
    rebuilt = made[index]
    scored, source = (rebuilt, "rebuilt") if rebuilt["question"] == question else (entry, "carried")
    return {"score": float(made.score_answer(answer=answer, entry=scored)), "entry": source}
