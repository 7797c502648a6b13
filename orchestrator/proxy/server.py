"""The per-job proxy server: three model APIs on a Unix socket only this job can reach.

    proxy = JobProxy(recorder, directory)       # directory: private (0700), bound into the sandbox
    await proxy.start()                         # listens on directory/proxy.sock
    ...                                         # the harness runs (relay.py inside the sandbox)
    await proxy.close()

Who gets in: the socket lives in a directory only this user can enter on the host, bound into
this job's sandbox alone; every request must carry the job's token (`Authorization: Bearer`,
what OpenAI clients send from OPENAI_API_KEY, or `x-api-key`, what Anthropic clients send from
ANTHROPIC_API_KEY); the peer's uid (SO_PEERCRED) must be ours.

Routes (also without the /v1 prefix):
    POST /v1/chat/completions          OpenAI chat completions      chat_completions.py
    POST /v1/messages                  Anthropic Messages           anthropic_messages.py
    POST /v1/messages/count_tokens     its token count (rendered by the chat template, not a call)
    POST /v1/responses                 OpenAI Responses             openai_responses.py
    GET  /v1/models[/ID]               the policy, in the Anthropic shape when the request carries
                                       `anthropic-version`, else the OpenAI shape
Anything else: 404 in the API's error shape, and the endpoint is listed in the row
(`unserved_endpoints`). A body over `max_body_bytes` (run.toml [proxy] max_body_mb) is refused
with 413 before it is read or parsed; bodies sent at once are read and parsed within one
allowance of that size (admission.py), so concurrency does not multiply what the job holds.
JSON nested past nesting.MAX_NESTING levels and typed fields of the wrong type (typed_fields.py)
are refused with 400 by each API's parser; no failure is answered outside the API's shape.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import struct
import weakref
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from orchestrator.proxy.admission import BodyAllowance
from orchestrator.proxy.anthropic_messages import AnthropicMessages
from orchestrator.proxy.api import Problem, ProxyApi
from orchestrator.proxy.chat_completions import ChatCompletions
from orchestrator.proxy.chat_form import BadRequest, ChatRequest, MessageForms
from orchestrator.proxy.nesting import too_deep
from orchestrator.proxy.openai_responses import OpenAIResponses
from orchestrator.proxy.recorder import BackendGone, CallRecorder, ClientGone, LimitReached

SOCKET_NAME = "proxy.sock"
TOKEN_NAME = "token"
RELAY_NAME = "relay.py"
DEFAULT_MODEL_NAME = "policy"
DEFAULT_MAX_BODY_BYTES = 4 << 20
# The job's converted history is kept up to this many bodies' worth (chat_form.MessageForms).
FORMS_BODIES = 2
LIMIT_PROBLEMS = {"context_full": Problem.CONTEXT_FULL, "max_turns": Problem.MAX_TURNS}
CLOSE_WAIT_S = 2.0   # a closing proxy's wait for calls in flight, then cancelled (start())


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def peer_uid(request: web.Request) -> int | None:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return int(uid)


def client_gone(request: web.Request) -> Callable[[], bool]:
    def gone() -> bool:
        transport = request.transport
        return transport is None or transport.is_closing()
    return gone


class JobProxy:
    def __init__(self, recorder: CallRecorder, directory: Path, *, token: str | None = None,
                 model_name: str = DEFAULT_MODEL_NAME, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.recorder = recorder
        self.directory = Path(directory)
        self.socket_path = self.directory / SOCKET_NAME
        self.token = token or read_token(self.directory)
        self.model_name = model_name
        self.max_body_bytes = max_body_bytes
        # Bodies are read and parsed one allowance at a time, however many requests come at once.
        self.intake = BodyAllowance(max_body_bytes)
        # One cache of converted history for every API of the job.
        self.forms = MessageForms(max_bytes=FORMS_BODIES * max_body_bytes)
        # Each connection's peer uid, read once: SO_PEERCRED is the connecting process's, fixed for
        # the connection's life, so keep-alive requests do not ask the kernel again.
        self._peers: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()
        self.chat = ChatCompletions(self.forms)
        self.messages = AnthropicMessages(self.forms)
        self.responses = OpenAIResponses(self.forms)
        self._runner: web.AppRunner | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        # A closing proxy (its job ended, was cancelled or cut) waits this long for calls in flight,
        # then cancels them, which aborts their generations: aiohttp's default wait is 60 s.
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False, shutdown_timeout=CLOSE_WAIT_S)
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
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._guard])
        for prefix in ("/v1", ""):
            app.router.add_get(f"{prefix}/models", self.models)
            app.router.add_get(f"{prefix}/models/{{model}}", self.model)
            app.router.add_post(f"{prefix}/chat/completions", self._route(self.chat))
            app.router.add_post(f"{prefix}/messages", self._route(self.messages))
            app.router.add_post(f"{prefix}/messages/count_tokens", self.count_tokens)
            app.router.add_post(f"{prefix}/responses", self._route(self.responses))
        app.router.add_route("*", "/{path:.*}", self.unserved)
        return app

    def _api_of(self, request: web.Request) -> ProxyApi:
        """Whose error shape a request gets when its route does not say: Anthropic clients send
        `anthropic-version` (and call /v1/messages...)."""
        if "anthropic-version" in request.headers or "/messages" in request.path:
            return self.messages
        return self.chat

    @staticmethod
    def _refuse(api: ProxyApi, problem: Problem, message: str, param: str | None = None,
                code: str | None = None, status: int | None = None) -> web.Response:
        return _json(api.error(problem, message, param, code), status or problem.status)

    # -- the guard ---------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        uid = self._peer_uid(request)
        if uid is not None and uid != os.getuid():
            return self._refuse(self._api_of(request), Problem.PERMISSION, f"peer uid {uid} is not this job's")
        given = request.headers.get("Authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else (
            request.headers.get("x-api-key") or request.headers.get("api-key", ""))
        if not token or not hmac.compare_digest(token.encode(), self.token.encode()):
            return self._refuse(self._api_of(request), Problem.AUTHENTICATION,
                                "missing or wrong API key: this proxy serves one job; use the OPENAI_API_KEY / "
                                "ANTHROPIC_API_KEY set in its sandbox")
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return self._too_large(request, request.content_length)
        return await handler(request)

    def _peer_uid(self, request: web.Request) -> int | None:
        transport = request.transport
        if transport is None:
            return peer_uid(request)
        try:
            return self._peers[transport]
        except KeyError:
            uid = self._peers[transport] = peer_uid(request)
            return uid

    def _too_large(self, request: web.Request, size: int | None) -> web.Response:
        told = f"{size} bytes" if size is not None else "more"
        return self._refuse(self._api_of(request), Problem.TOO_LARGE,
                            f"the request body has {told}; this proxy takes at most {self.max_body_bytes} bytes "
                            "(run.toml [proxy] max_body_mb)")

    # -- routes ------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        if "anthropic-version" in request.headers:
            return _json(self.messages.models(self.model_name))
        return _json({"object": "list", "data": [self._openai_model()]})

    async def model(self, request: web.Request) -> web.Response:
        if "anthropic-version" in request.headers:
            return _json(self.messages.model_entry(request.match_info["model"]))
        return _json({**self._openai_model(), "id": request.match_info["model"]})

    def _openai_model(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": 0, "owned_by": "hpc-rollout",
                "max_model_len": self.recorder.limits.max_context_tokens}

    async def unserved(self, request: web.Request) -> web.Response:
        endpoint = f"{request.method} {request.path}"
        self.recorder.note_unserved(endpoint)
        return self._refuse(self._api_of(request), Problem.NOT_FOUND,
                            f"{endpoint} is not served by this job's proxy; it serves POST /v1/chat/completions, "
                            "/v1/messages, /v1/messages/count_tokens, /v1/responses and GET /v1/models")

    async def _body(self, request: web.Request) -> Any:
        try:
            return orjson.loads(await request.read())
        except web.HTTPRequestEntityTooLarge:
            raise _TooLarge() from None
        except orjson.JSONDecodeError as exc:
            if exc.msg.startswith("depth limit"):   # orjson reads at most 1024 levels
                raise too_deep("the body", in_field=False) from None
            raise BadRequest(f"the body is not JSON: {exc}") from None

    async def _parsed(self, request: web.Request, parse: Callable[[Any], ChatRequest]) -> ChatRequest:
        """The request's body, read and parsed within the job's body allowance (admission.py)."""
        async with self.intake.hold(request.content_length):
            return parse(await self._body(request))

    def _route(self, api: ProxyApi) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            return await self._serve(request, api)
        return serve

    async def _serve(self, request: web.Request, api: ProxyApi) -> web.StreamResponse:
        try:
            chat = await self._parsed(request, api.parse)
            reply = await self.recorder.complete(chat, client_gone(request))
            if not chat.stream:
                return _json(api.answer(chat, reply, self.model_name))
            # The reply is whole already: its events go in one write (one wake-up of the harness).
            events = b"".join(api.events(chat, reply, self.model_name))
        except _TooLarge:
            return self._too_large(request, None)
        except BadRequest as exc:
            problem = Problem.NOT_FOUND if exc.status == 404 else Problem.INVALID
            return self._refuse(api, problem, str(exc), exc.param, exc.code, exc.status)
        except LimitReached as exc:
            return self._refuse(api, LIMIT_PROBLEMS[exc.reason], str(exc))
        except BackendGone as exc:  # the harness must stop: its job ends with the backend's error
            return self._refuse(api, Problem.BACKEND_GONE, f"the job's model backend failed: {exc}")
        except ClientGone:
            return web.Response(status=499)   # nobody reads it
        except Exception as exc:  # the proxy's own failure on this request (a template that cannot render it...)
            return self._server_error(api, exc)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        await stream.write(events)
        await stream.write_eof()
        return stream

    def _server_error(self, api: ProxyApi, exc: Exception) -> web.Response:
        return self._refuse(api, Problem.SERVER, f"the proxy could not serve this request: {type(exc).__name__}: {exc}")

    async def count_tokens(self, request: web.Request) -> web.Response:
        api = self.messages
        try:
            chat = await self._parsed(request, lambda body: api.parse(body, counting=True))
            return _json({"input_tokens": await self.recorder.count_tokens(chat)})
        except _TooLarge:
            return self._too_large(request, None)
        except BadRequest as exc:
            return self._refuse(api, Problem.INVALID, str(exc), exc.param, exc.code, exc.status)
        except LimitReached as exc:
            return self._refuse(api, LIMIT_PROBLEMS[exc.reason], str(exc))
        except Exception as exc:  # in the API's shape, never aiohttp's plain-text 500
            return self._server_error(api, exc)


class _TooLarge(Exception):
    pass


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
