"""Scripted replies of the proxy tests (one scripted serve-llm serves every module)."""

from __future__ import annotations

import json
from typing import Any


def tool_call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


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
