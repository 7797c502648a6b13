"""Runs one reward function call inside a scorer sandbox (standard library only; uploaded there).

    PYTHON -I -B scorer_runner.py CALL.json RESULT.json

CALL: {"function": NAME, "kwargs": {...}} and either
      "module": "verl.utils.reward_score" (an installed function, from the worker's Python bound
      read-only) with optional "light_parents": ["verl", "verl.utils"], or
      "file": "custom_reward.py" (the operator's file, uploaded next to this script).
RESULT: {"result": the return value as JSON} or {"error": "...", "traceback": "..."}.

light_parents: packages whose __init__ is not run (a bare package stands in for each). verl's
imports torch, transformers, Ray's settings and every verl plugin (13-20 s and 370 MB per call on
a 2-core node) for scorers that use none of it. If the module cannot be imported that way, it is
imported again the ordinary way.
"""

from __future__ import annotations   # annotations stay strings: any python3 >= 3.8 runs this

import importlib
import importlib.util
import inspect
import json
import math
import sys
import traceback
import types
from typing import Any, Callable

MAX_RESULT_BYTES = 1 << 20   # a score and its extra info; more is a broken reward function


def with_light_parents(module: str, parents: list[str]) -> Any:
    for name in parents:
        found = importlib.util.find_spec(name) if "." not in name else None
        if found is not None and found.submodule_search_locations:
            root = list(found.submodule_search_locations)[0]
        else:
            parent = sys.modules.get(name.rsplit(".", 1)[0])
            if parent is None or not getattr(parent, "__path__", None):
                raise ImportError(f"cannot locate package {name}")
            root = parent.__path__[0] + "/" + name.rsplit(".", 1)[1]
        package = types.ModuleType(name)
        package.__path__ = [root]
        sys.modules[name] = package
    return importlib.import_module(module)


def installed_function(call: dict[str, Any]) -> Callable[..., Any]:
    parents = list(call.get("light_parents") or [])
    try:
        module = with_light_parents(call["module"], parents)
    except Exception:
        root = call["module"].split(".")[0]
        for name in [n for n in sys.modules if n == root or n.startswith(root + ".")]:
            del sys.modules[name]
        module = importlib.import_module(call["module"])
    return getattr(module, call["function"])


def file_function(call: dict[str, Any]) -> Callable[..., Any]:
    spec = importlib.util.spec_from_file_location("hpc_rollout_custom_reward", call["file"])
    if spec is None or spec.loader is None:
        raise ImportError(f"{call['file']} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function = getattr(module, call["function"], None)
    if not callable(function):
        raise AttributeError(f"the reward file has no function {call['function']!r}")
    return function


def plain(value: Any) -> Any:
    """JSON for what reward functions return: numpy scalars and arrays, tuples, anything else as text."""
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return str(value)


def encoded(result: Any) -> str:
    if isinstance(result, float) and not math.isfinite(result):
        return json.dumps({"error": f"the reward function returned {result!r}, not a finite number"})
    return json.dumps({"result": result}, default=plain)


def main() -> None:
    with open(sys.argv[1]) as handle:
        call = json.load(handle)
    try:
        function = file_function(call) if call.get("file") else installed_function(call)
        result = function(**call["kwargs"])
        if inspect.isawaitable(result):
            getattr(result, "close", lambda: None)()
            raise TypeError(f"{call['function']} is a coroutine function: give a plain function for EVAL")
        text = encoded(result)
        if len(text) > MAX_RESULT_BYTES:
            text = json.dumps({"error": f"the reward function returned {len(text)} bytes of JSON; "
                                        f"at most {MAX_RESULT_BYTES} (a score and a little extra info)"})
    except BaseException as exc:   # SystemExit from a scorer is a failure to report too
        text = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:2000],
                           "traceback": traceback.format_exc()[-4000:]})
    with open(sys.argv[2], "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
