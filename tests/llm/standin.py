"""A small stand-in server speaking SGLang's native protocol exactly (/generate, /model_info,
/health, /v1/models), scripted and deterministic, run in a background thread.

Output ids continue the prompt: (last id + k) % 1000 for k = 1..max_new_tokens; logprob of
token k is -k/10. `fail_next` answers that many requests with HTTP 503 first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.llm.app_thread import AppThread


@dataclass
class StandIn:
    weight_version: str = "7"
    max_model_len: int = 64
    fail_next: int = 0
    healthy: bool = True
    health_checks: int = 0
    model_lists: int = 0               # GET /v1/models answered
    requests: list[dict[str, Any]] = field(default_factory=list)
    peers: list[Any] = field(default_factory=list)   # (host, port) of the connection each /generate came on
    url: str = ""
    _server: AppThread | None = None

    def answer(self, input_ids: list[int], params: dict[str, Any], logprob: bool) -> dict[str, Any]:
        n = int(params.get("max_new_tokens", 128))
        out = [(input_ids[-1] + k) % 1000 for k in range(1, n + 1)]
        meta: dict[str, Any] = {
            "id": "x", "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": len(input_ids), "completion_tokens": n, "cached_tokens": 0,
            "weight_version": self.weight_version,
        }
        if logprob:
            meta["output_token_logprobs"] = [[-k / 10, tok, None] for k, tok in enumerate(out, 1)]
        return {"text": " ".join(map(str, out)), "output_ids": out, "meta_info": meta}

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.Response(status=503, text="overloaded")
        inputs = body["input_ids"]
        params = body.get("sampling_params", {})
        logprob = bool(body.get("return_logprob"))
        if inputs and isinstance(inputs[0], list):
            return web.json_response([self.answer(i, params, logprob) for i in inputs])
        return web.json_response(self.answer(inputs, params, logprob))

    async def health(self, _: web.Request) -> web.Response:
        self.health_checks += 1
        return web.Response(status=200 if self.healthy else 503)

    async def models(self, _: web.Request) -> web.Response:
        self.model_lists += 1
        return web.json_response({"object": "list", "data": [
            {"id": "standin-model", "object": "model", "max_model_len": self.max_model_len}]})

    async def model_info(self, _: web.Request) -> web.Response:
        return web.json_response({"model_path": "standin-model", "weight_version": self.weight_version})

    def __enter__(self) -> "StandIn":
        app = web.Application()
        app.add_routes([web.post("/generate", self.generate), web.get("/health", self.health),
                        web.get("/v1/models", self.models), web.get("/model_info", self.model_info)])
        self._server = AppThread(app)
        self.url = self._server.__enter__()
        return self

    def __exit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.__exit__()
