"""What the proxy's server needs of each API it serves (chat completions, Anthropic Messages,
OpenAI Responses): its request as a `ChatRequest`, the recorder's `Reply` as its answer (whole,
or as server-sent events), and its own error shape for every problem."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any, Protocol

from orchestrator.proxy.chat_form import ChatRequest


class Problem(str, enum.Enum):
    """Why a request is refused, independent of the API (each API names it its own way)."""

    INVALID = "invalid_request"          # 400: a field or a message the proxy cannot serve
    AUTHENTICATION = "authentication"    # 401: no or a wrong key
    PERMISSION = "permission"            # 403: a peer that is not the job's
    NOT_FOUND = "not_found"              # 404: an endpoint the proxy does not serve
    TOO_LARGE = "too_large"              # 413: a body over proxy.max_body_mb
    CONTEXT_FULL = "context_full"        # 400: the job's max_context_tokens
    MAX_TURNS = "max_turns"              # 400: the job's max_calls
    BACKEND_GONE = "backend_unavailable"  # 503: the job's backend failed for good
    SERVER = "server_error"              # 500: the proxy's own failure on this request

    @property
    def status(self) -> int:
        return STATUS[self]


STATUS = {Problem.INVALID: 400, Problem.AUTHENTICATION: 401, Problem.PERMISSION: 403, Problem.NOT_FOUND: 404,
          Problem.TOO_LARGE: 413, Problem.CONTEXT_FULL: 400, Problem.MAX_TURNS: 400,
          Problem.BACKEND_GONE: 503, Problem.SERVER: 500}


class ProxyApi(Protocol):
    name: str

    def parse(self, body: Any) -> ChatRequest:
        """The request in a body (raises chat_form.BadRequest naming what cannot be served)."""

    def answer(self, request: ChatRequest, reply: Any, model: str) -> dict[str, Any]:
        """The whole answer to `request`."""

    def events(self, request: ChatRequest, reply: Any, model: str) -> Iterator[bytes]:
        """The answer as server-sent event frames."""

    def error(self, problem: Problem, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
        """The API's error body (`code`: a more precise code than the problem's own, if any)."""


def sse(data: dict[str, Any] | bytes, event: str | None = None) -> bytes:
    """One server-sent event frame (`event:` line when the API names its events)."""
    import orjson

    payload = data if isinstance(data, bytes) else orjson.dumps(data)
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + payload + b"\n\n"
