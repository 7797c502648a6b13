"""The form every API's request takes in the proxy: chat messages as the chat template renders
them, the keys that decide whether a call continues an earlier one, and tool declarations.

Each API module (chat_completions, anthropic_messages, openai_responses) turns its request into
a `ChatRequest` of these forms and the recorder's reply back into its own shape; what maps to
the chat template (messages, tool declarations, tool calls) is built here, in one place:

    chat_message(role, text, calls, tool_call_id)    a message as templates read it
    template_call(call_id, name, arguments)         a tool call inside an assistant message
    template_tool(name, description, parameters)    a tool declaration (OpenAI function form,
                                                    what Hugging Face chat templates expect)
    message_key(message)                            what makes two messages the same turn

Keys compare role, text, tool calls (name and arguments as parsed JSON) and tool_call_id, and
ignore what clients add when they echo a reply (`provider_specific_fields`, `refusal`, call
ids of the assistant's calls, argument spacing). A harness resends its whole history on every
call: `MessageForms` (one per job) converts each distinct piece of it once, and the items the
last request sent already, byte for byte in the same places, are not looked at again (one JSON
dump of the list and one byte comparison), so a call's Python work does not grow with the
conversation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from orchestrator.agent.calls import ParsedReply
from orchestrator.proxy.bad_request import BadRequest as BadRequest   # where the API modules find it
from orchestrator.proxy.nesting import check_nesting

# Sampling parameters a harness may set; the job's own sampling parameters win over them.
PASSED_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                   "frequency_penalty", "repetition_penalty")
ROLES = ("system", "developer", "user", "assistant", "tool")
# What MessageForms keeps when not told (the job's proxy tells it: 2 x [proxy] max_body_mb).
DEFAULT_FORMS_BYTES = 8 << 20
TOOL_SETS = 64   # distinct tool sets MessageForms keeps converted

Key = tuple[Any, ...]
Form = tuple[dict[str, Any], Key]


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[dict[str, Any], ...]          # as the template renders them
    keys: tuple[Key, ...]                         # message_key of each
    tools: list[dict[str, Any]] | None            # template_tool form
    tools_key: str
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    parse_tools: bool = True
    api: str = "chat_completions"                 # which API asked (recorded with the call)
    call_id_prefix: str = "call_"                 # ids of the reply's tool calls start with it
    context: dict[str, Any] = field(default_factory=dict)   # what the API's answer echoes back


# -- the chat template's forms ------------------------------------------------------------------
def template_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A tool call inside an assistant message; `arguments` as a JSON string (or an object,
    serialized here), as the OpenAI form has them and templates print them."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_message(role: str, text: str, calls: Sequence[dict[str, Any]] = (),
                 tool_call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    if role not in ROLES:
        raise BadRequest(f"message role {role!r}: the chat template knows {', '.join(ROLES)}")
    message: dict[str, Any] = {"role": role, "content": text}
    if calls:
        message["tool_calls"] = list(calls)
    if tool_call_id is not None:
        message["tool_call_id"] = tool_call_id
    if name is not None:
        message["name"] = name
    return message


def template_tool(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    """A tool declaration as chat templates render it (the OpenAI function form)."""
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}: a tool needs a name", param=where)
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise BadRequest(f"{where}: the schema of tool {name!r} must be a JSON object", param=where)
    function: dict[str, Any] = {"name": name}
    if isinstance(description, str) and description:
        function["description"] = description
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def _arguments(value: Any) -> Any:
    """Arguments as the object they spell; text that is not JSON (or nests beyond what Python's
    json reads: a reply's, as requests' are checked first) stays the text it is."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return value
    return value


def _arguments_key(value: Any) -> str:
    """The arguments as sorted JSON; text that is not JSON (to orjson: NaN, integers past 64 bits
    too) stays the text it is. Keys are only compared with keys made here, in this process."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value) if value.strip() else {}
        except orjson.JSONDecodeError:
            return value
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:   # deeper than orjson writes, or not JSON at all
        return str(value)


def message_key(message: dict[str, Any]) -> Key:
    """What makes two messages the same turn (see the module's docstring)."""
    calls = tuple((c["function"]["name"], _arguments_key(c["function"]["arguments"]))
                  for c in message.get("tool_calls") or ())
    return (message["role"], str(message.get("content") or "").strip(), calls, message.get("tool_call_id") or "")


def arguments_object(arguments: str) -> dict[str, Any]:
    """A reply's call arguments (a JSON string the parser wrote) as the object APIs show."""
    value = _arguments(arguments)
    return value if isinstance(value, dict) else {"value": value}


@dataclass(frozen=True)
class Reply:
    """One generation as every API answers it: the assistant message in template form (content
    text or None, tool_calls), the backend's finish reason and the token counts."""

    message: dict[str, Any]
    finish_reason: str              # the backend's: stop | length
    prompt_tokens: int
    completion_tokens: int

    @property
    def text(self) -> str:
        return str(self.message.get("content") or "")

    @property
    def calls(self) -> list[dict[str, Any]]:
        return list(self.message.get("tool_calls") or ())

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length" and not self.calls


def reply_message(parsed: ParsedReply | None, text: str, call_prefix: str) -> dict[str, Any]:
    """The assistant message of a reply. A reply with a malformed call is returned as plain text
    (as vLLM's parsers do): the harness sees exactly what the model wrote."""
    if parsed is None or parsed.errors or not parsed.calls:
        return {"role": "assistant", "content": text if parsed is None or parsed.errors else parsed.content}
    calls = [template_call(f"{call_prefix}_{i}", c.name, c.arguments) for i, c in enumerate(parsed.calls)]
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}


# -- the job's cache of converted pieces --------------------------------------------------------
@dataclass(frozen=True)
class History:
    """A list of items (messages, input items) in template form: each form, and its messages
    and keys apart (tuples a later request's history starts with, shared, not copied)."""

    forms: tuple[Form, ...] = ()
    messages: tuple[dict[str, Any], ...] = ()
    keys: tuple[Key, ...] = ()

    def __add__(self, other: "History") -> "History":
        return History(self.forms + other.forms, self.messages + other.messages, self.keys + other.keys)

    @classmethod
    def of(cls, forms: Sequence[Form]) -> "History":
        forms = tuple(forms)
        return cls(forms, tuple(message for message, _ in forms), tuple(key for _, key in forms))


@dataclass(frozen=True)
class _Settled:
    """The last request's items whose forms cannot change by what follows them."""

    kind: str
    head: bytes         # their JSON list, without its closing bracket
    items: int
    history: History


class MessageForms:
    """The template forms and keys of each piece of history a job's harness sent (a message, or a
    group of items that make one message), by the piece's JSON: the history a harness resends
    is converted once. The bytes are the dict's own order, so a client that reorders keys only
    misses the cache. A piece's nesting is checked (nesting.py) when it is first converted.

    Bounded by `limit` entries and by `max_bytes` of JSON, for messages and again for tool sets
    (the job's proxy gives two bodies' worth: its harness's history, and another conversation's):
    requests refused after their first messages converted cannot make the proxy keep them all."""

    def __init__(self, limit: int = 20_000, max_bytes: int = DEFAULT_FORMS_BYTES) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self._forms: dict[tuple[str, bytes], tuple[Form, ...]] = {}
        self._tools: dict[tuple[str, bytes], tuple[list[dict[str, Any]], str]] = {}
        self._forms_bytes = 0
        self._tools_bytes = 0
        self._settled: _Settled | None = None   # one request's worth: what a harness resends next

    def converted(self, kind: str, raw: Any, convert: Callable[[Any], list[dict[str, Any]]], *,
                  where: str = "messages", above: int = 2) -> tuple[Form, ...]:
        """The template messages `convert(raw)` gives, with their keys (cached by `kind` + JSON);
        `raw` sits `above` levels down the body (a message of a list: 2)."""
        blob = _json_of(raw, where, above)
        forms = self._forms.get((kind, blob))
        if forms is None:
            check_nesting(raw, where, above)
            forms = tuple((message, message_key(message)) for message in convert(raw))
            if len(self._forms) >= self.limit or self._forms_bytes + len(blob) > self.max_bytes:
                self._forms.clear()
                self._forms_bytes = 0
            self._forms[(kind, blob)] = forms
            self._forms_bytes += len(blob)
        return forms

    def history(self, kind: str, raw: list[Any], convert: Callable[[Any], list[dict[str, Any]]], *,
                units: Callable[[list[Any]], list[Any]] = list, open_items: Callable[[list[Any]], int] = lambda u: 0,
                where: str = "messages", above: int = 2) -> History:
        """The forms of a request's list of items, each unit of `units(items)` converted as
        `converted` does; `open_items(units)`: how many of the last items may still join a unit
        with items sent after them (their forms are not kept as settled).

        A harness resends its whole history each call: the items the last request of this kind
        sent, byte for byte (a prefix of this list's JSON), keep their forms without a look at
        each (their nesting was checked when they were converted); units are cut causally, so
        the settled items cut the same way whatever follows them."""
        try:
            blob: bytes | None = orjson.dumps(raw)
        except TypeError:   # too deep for orjson: each unit's conversion names the problem
            blob = None
        start, done = 0, History()
        last = self._settled
        if (blob is not None and last is not None and last.kind == kind and last.items
                and blob.startswith(last.head) and blob[len(last.head):len(last.head) + 1] in (b",", b"]")):
            start, done = last.items, last.history
        rest = units(raw[start:])
        groups = [self.converted(kind, unit, convert, where=where, above=above) for unit in rest]
        pending = open_items(rest)
        closed = len(groups) - (1 if pending else 0)
        settled = done + History.of([form for group in groups[:closed] for form in group])
        if blob is not None:
            items = len(raw) - pending
            head = blob[:-1] if not pending else orjson.dumps(raw[:items])[:-1]
            self._settled = _Settled(kind, head, items, settled)
        if not pending:
            return settled
        return settled + History.of(groups[-1])

    def tools(self, kind: str, raw: Any,
              convert: Callable[[Any], list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], str]:
        """The template tool declarations of `raw` (the body's `tools`) and the key that tells
        tool sets apart."""
        blob = _json_of(raw, "tools", 1)
        found = self._tools.get((kind, blob))
        if found is None:
            check_nesting(raw, "tools", above=1)
            tools = convert(raw)
            found = (tools, json.dumps(tools, sort_keys=True) if tools else "")
            if len(self._tools) >= TOOL_SETS or self._tools_bytes + len(blob) > self.max_bytes:
                self._tools.clear()
                self._tools_bytes = 0
            self._tools[(kind, blob)] = found
            self._tools_bytes += len(blob)
        return found


def _json_of(raw: Any, where: str, above: int) -> bytes:
    try:
        return orjson.dumps(raw)
    except TypeError:   # orjson writes at most 254 levels: refused for its nesting, named
        check_nesting(raw, where, above)
        raise BadRequest(f"{where}: unreadable: {str(raw)[:120]!r}", param=where) from None


def positive_int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{name} must be a positive integer, got {value!r}", param=name)
    return value


def check_fields(body: dict[str, Any], known: set[str], api: str) -> None:
    """Refuse a field the proxy does not know: silently dropping it could change what the
    harness asked for."""
    unknown = sorted(set(body) - known)
    if unknown:
        raise BadRequest(f"unsupported field(s) {', '.join(unknown)} for {api}: this proxy serves "
                         f"{', '.join(sorted(known))} (see docs/proxy.md)", param=unknown[0])
