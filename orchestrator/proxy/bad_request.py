"""The one error of request parsing: a request the proxy cannot serve, and why."""

from __future__ import annotations

from orchestrator.errors import HpcRolloutError


class BadRequest(HpcRolloutError, ValueError):
    """A request the proxy cannot serve; answered with HTTP 400 (or `status`) in the API's own
    error shape, naming the problem. `param`: the offending field, when there is one."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status
