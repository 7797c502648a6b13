"""The per-job proxy server: OpenAI chat completions on a Unix socket only this job can reach.

    proxy = JobProxy(recorder, directory)       # directory: private (0700), bound into the sandbox
    await proxy.start()                         # listens on directory/proxy.sock
    ...                                         # the harness runs (relay.py inside the sandbox)
    await proxy.close()

Who gets in: the socket lives in a directory only this user can enter on the host, bound into
this job's sandbox alone; every request must carry the job's token (`Authorization: Bearer`,
what OpenAI clients send from OPENAI_API_KEY); the peer's uid (SO_PEERCRED) must be ours.
Routes: GET /v1/models, POST /v1/chat/completions (`stream: true` answers server-sent events),
also without the /v1 prefix.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import struct
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from orchestrator.proxy.recorder import BackendGone, CallRecorder, LimitReached
from orchestrator.proxy.wire import (
    BadRequest, MessageForms, completion_body, error_body, finish_reason, parse_request, stream_chunks,
)

SOCKET_NAME = "proxy.sock"
TOKEN_NAME = "token"
RELAY_NAME = "relay.py"
DEFAULT_MODEL_NAME = "policy"


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def peer_uid(request: web.Request) -> int | None:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return int(uid)


class JobProxy:
    def __init__(self, recorder: CallRecorder, directory: Path, *, token: str | None = None,
                 model_name: str = DEFAULT_MODEL_NAME) -> None:
        self.recorder = recorder
        self.directory = Path(directory)
        self.socket_path = self.directory / SOCKET_NAME
        self.token = token or read_token(self.directory)
        self.model_name = model_name
        self.forms = MessageForms()
        self._runner: web.AppRunner | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.socket_path)).start()
        os.chmod(self.socket_path, 0o600)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.socket_path.unlink(missing_ok=True)

    async def __aenter__(self) -> "JobProxy":
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[self._guard])
        for prefix in ("/v1", ""):
            app.router.add_get(f"{prefix}/models", self.models)
            app.router.add_post(f"{prefix}/chat/completions", self.chat)
        return app

    # -- the guard ---------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        uid = peer_uid(request)
        if uid is not None and uid != os.getuid():
            return _json(error_body(f"peer uid {uid} is not this job's", "permission_error"), 403)
        given = request.headers.get("Authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else request.headers.get("api-key", "")
        if not token or not hmac.compare_digest(token.encode(), self.token.encode()):
            return _json(error_body("missing or wrong API key: this proxy serves one job; use the "
                                    "OPENAI_API_KEY set in its sandbox", "authentication_error", "invalid_api_key"), 401)
        return await handler(request)

    # -- routes ------------------------------------------------------------------------------
    async def models(self, _: web.Request) -> web.Response:
        return _json({"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                   "owned_by": "hpc-rollout",
                                                   "max_model_len": self.recorder.limits.max_context_tokens}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
            chat = parse_request(body, forms=self.forms)
            reply = await self.recorder.complete(chat)
        except orjson.JSONDecodeError as exc:
            return _json(error_body(f"the body is not JSON: {exc}"), 400)
        except BadRequest as exc:
            return _json(error_body(str(exc)), 400)
        except LimitReached as exc:
            code = "context_length_exceeded" if exc.reason == "context_full" else "max_turns_reached"
            return _json(error_body(str(exc), code=code), 400)
        except BackendGone as exc:  # the harness must stop: its job ends with the backend's error
            return _json(error_body(f"the job's model backend failed: {exc}", "server_error", "backend_unavailable"), 503)
        except Exception as exc:  # the proxy's own failure on this request (a template that cannot render it...)
            return _json(error_body(f"the proxy could not serve this request: {type(exc).__name__}: {exc}",
                                    "server_error"), 500)
        answer = completion_body(chat.model or self.model_name, reply.message,
                                 finish_reason(reply.message, reply.finish_reason),
                                 reply.prompt_tokens, reply.completion_tokens)
        if not chat.stream:
            return _json(answer)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        for chunk in stream_chunks(answer, chat.include_usage):
            await stream.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await stream.write(b"data: [DONE]\n\n")
        await stream.write_eof()
        return stream


def new_proxy_dir(parent: Path, name: str | None = None) -> Path:
    """A private directory with the job's token and the relay (its socket appears in it when the
    proxy starts): `parent/name`, or a fresh random name. Created exclusively, files included: the
    parent may be bound into a sandbox, which must not plant links there."""
    from orchestrator.sandbox.records import SOCKET_PATH_MAX, private_dir

    private_dir(parent, parents=True)
    while True:
        path = parent / (name or secrets.token_hex(6))
        try:
            path.mkdir(mode=0o700)
            break
        except FileExistsError:
            if name:
                raise
    socket_path = path / SOCKET_NAME
    if len(str(socket_path).encode()) > SOCKET_PATH_MAX:
        path.rmdir()
        raise ValueError(f"the proxy's socket path {socket_path} is longer than {SOCKET_PATH_MAX} bytes; set "
                         "HPC_ROLLOUT_RUNTIME_DIR to a short node-local directory such as /tmp/hr")
    _write_new(path / TOKEN_NAME, f"hr-{secrets.token_urlsafe(24)}\n".encode())
    _write_new(path / RELAY_NAME, Path(__file__).with_name("relay.py").read_bytes())
    return path


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def read_token(directory: Path) -> str:
    return (Path(directory) / TOKEN_NAME).read_text().strip()
