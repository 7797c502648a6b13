"""The JSON object body of a request to the reference server (its routes and the reload routes)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


async def read_body(http: web.Request) -> dict[str, Any]:
    """The body as a dict, or 400 Bad Request saying why not."""
    try:
        body = orjson.loads(await http.read())
    except orjson.JSONDecodeError as exc:
        raise web.HTTPBadRequest(text=f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="body must be a JSON object")
    return body
