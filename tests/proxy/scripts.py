"""Scripted replies of the proxy tests (one scripted serve-llm serves every module)."""

from __future__ import annotations

import json
from typing import Any


def tool_call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def deep_call(levels: int) -> str:
    """A tool call whose arguments nest `levels` + 1 levels deep."""
    return '<tool_call>\n{"name": "bash", "arguments": {"a": ' + "[" * levels + "]" * levels + "}}\n</tool_call>"


DEEP_REPLIES = (300, 1100)   # past what orjson writes (254), past what Python's json reads (~1000)
BASH_TOOL = [{"type": "function", "function": {
    "name": "bash", "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
SCRIPTS = [
    {"match": "Task fidelity.", "replies": ["Let me look." + tool_call("bash", command="ls -la"),
                                            tool_call("bash", command="cat notes.txt"), "The answer is 42."]},
    {"match": "Task rewrite.", "replies": [tool_call("bash", command=f"echo step {n}") for n in range(6)]},
    {"match": "Task sandbox.", "replies": ["hello from the policy"]},
    # The same conversation for each API's official client (tests/proxy/test_anthropic_messages.py,
    # test_openai_responses.py); a cut reply for max_tokens.
    *({"match": f"Task {api}.", "replies": ["Let me look." + tool_call("bash", command="ls -la"),
                                             tool_call("bash", command="cat notes.txt"), "The answer is 42."]}
      for api in ("anthropic", "responses", "cancel anthropic", "cancel responses")),
    {"match": "Task long.", "replies": ["word " * 200]},
    # A policy's tool call nested past what the APIs' answers can carry (tests/proxy/test_proxy_request_checks.py).
    *({"match": f"Task deep reply {levels}.", "replies": [deep_call(levels)]} for levels in DEEP_REPLIES),
]


BOXED = "\\boxed{391}"
CASES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "solve": ([tool_call("bash", command="echo $((17 * 23))"), BOXED], {}),
    "rewrite": ([tool_call("bash", command="echo a"), tool_call("bash", command="echo b"), BOXED],
                {"command": "python3 /harness/toy_agent.py --drop-at 2"}),
    "per-request": ([tool_call("bash", command="echo 391"), BOXED], {"builder": "per_request"}),
    "limit": ([tool_call("bash", command="echo again")] * 8, {"max_calls": 2}),
    "probe": ([BOXED], {"command": "python3 /harness/toy_agent.py --probe /files"}),
}


def all_scripts() -> list[dict[str, Any]]:
    return SCRIPTS + [{"match": f"Harness {name}.", "replies": replies} for name, (replies, _) in CASES.items()]
