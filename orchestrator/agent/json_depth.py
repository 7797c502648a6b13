"""How deep JSON from a model or a harness may nest: MAX_NESTING levels of objects and arrays.

Deeper JSON is refused before anything recursive reads it: orjson (tickets, rows, the proxy's
cache keys) cannot write beyond 254 levels, and Python's json and a chat template's `tojson` run
out of stack near 1000. Checked without recursion, so the check itself never runs out of stack.
"""

from __future__ import annotations

from typing import Any

MAX_NESTING = 64


def nests_within(value: Any, levels: int) -> bool:
    """Whether `value` nests at most `levels` levels of objects and arrays (a scalar: 0)."""
    if type(value) is not dict and type(value) is not list:
        return True
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if level > levels:
            return False
        for child in node.values() if type(node) is dict else node:
            if type(child) is dict or type(child) is list:
                stack.append((child, level + 1))
    return True


def deepest(value: Any) -> int:
    """The levels of `value` (only to word a refusal)."""
    found, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        found = max(found, level)
        for child in node.values() if type(node) is dict else node:
            if type(child) is dict or type(child) is list:
                stack.append((child, level + 1))
    return found
