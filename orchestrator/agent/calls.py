"""What a tool-call parser finds in one model reply."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a tool name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]
    id: str = ""

    @cached_property
    def arguments_json(self) -> str:
        """The arguments as a JSON string (written once: the message and the call's record share it)."""
        return json.dumps(self.arguments, ensure_ascii=False)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat `tool_calls` entry (arguments as a JSON string, as the API has them)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True)
class ParsedReply:
    """The reply's text outside the calls, the calls, and one message per malformed call."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = field(default=())
