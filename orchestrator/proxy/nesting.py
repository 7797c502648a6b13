"""How deep a request's JSON may nest: `MAX_NESTING` levels of objects and arrays, counted from
the body (the body is level 1, a message level 3, an Anthropic tool's input_schema level 4).

Deeper JSON is refused with 400 naming the limit before anything recursive reads it: orjson
cannot write beyond 254 levels (the cache keys of chat_form.MessageForms, the answers that echo
a field), Python's json and the chat template's `tojson` run out of stack near 1000, and a tool
call's arguments arrive as a JSON string. Each piece of history is checked once, when the job's
proxy first converts it (chat_form.MessageForms): a call's cost does not grow with its history.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.agent.json_depth import MAX_NESTING, deepest, nests_within
from orchestrator.proxy.bad_request import BadRequest



def too_deep(where: str, levels: int | None = None, *, in_field: bool = True) -> BadRequest:
    """The refusal; `where` starts with the field's name when `in_field`."""
    told = f"nests {levels} levels deep" if levels is not None else "nests too deep to read"
    return BadRequest(f"{where}: the request's JSON {told}; this proxy serves at most {MAX_NESTING} levels of "
                      "nested objects and arrays (flatten the schema or the content)",
                      param=where.split(" ")[0] if in_field else None)


def check_nesting(value: Any, where: str, above: int = 0) -> None:
    """Refuse `value` (found `above` levels down the body) if it reaches past MAX_NESTING."""
    if not nests_within(value, MAX_NESTING - above):
        raise too_deep(where, deepest(value) + above)




def check_fields_nesting(body: dict[str, Any], converted: tuple[str, ...]) -> None:
    """The body's fields other than `converted` (those are checked as MessageForms converts them)."""
    for name, value in body.items():
        if name not in converted:
            check_nesting(value, name, above=1)


def check_arguments(arguments: Any, where: str) -> None:
    """A tool call's arguments in a request: a JSON object, or a JSON string of one (parsed here,
    so its nesting is known before the call's key and the template read it)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return          # not JSON: kept and compared as the text it is
        except RecursionError:
            raise too_deep(where) from None
    check_nesting(arguments, where)
