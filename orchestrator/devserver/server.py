"""The reference backend: a real model behind vLLM's (and SGLang's) HTTP protocol.

Endpoints: GET /health, /v1/models, /model_info, /metrics (requests in flight, vLLM's names); POST /v1/completions (token ids in,
`token_ids` + per-token logprobs out), /generate (SGLang's native shape), /tokenize,
/detokenize; weight reload while serving as vLLM (/collective_rpc reload_weights) and SGLang
(/update_weights_from_disk) do it (orchestrator/devserver/reload.py); abort of every generation in
flight as vLLM's dev mode (/abort_requests) and SGLang (/abort_request) do it, or of one /generate
by its `rid` (SGLang's /abort_request {"rid": ...}): each answers what it sampled so far with
finish reason `abort`. A client that disconnects aborts its request, as with vLLM and SGLang.

Logprobs: by default each endpoint answers as the stock server it imitates (/v1/completions raw,
like vLLM; /generate processed, like SGLang) and /v1/models says nothing about them. Started with
`logprobs_mode` (serve-llm --logprobs-mode raw|processed) both endpoints return that kind, and
/v1/models and /model_info announce it (`logprobs_mode`), which `backend add` records.
With a record file, every generation appends one JSON line:
{"endpoint", "prompt_ids", "output_ids", "logprobs", "finish_reason", "time"}.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from orchestrator.devserver.generation import Engine
from orchestrator.devserver.sampling import GenRequest, GenResult
from orchestrator.devserver.reload import add_reload_routes
from orchestrator.llm.request_body import read_body

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerOptions:
    model_dir: Path
    host: str = "127.0.0.1"
    port: int = 8000
    record: Path | None = None
    max_model_len: int = 2048
    max_batch: int = 8
    threads: int | None = None
    weight_version: str = "0"
    legacy_vllm: bool = False    # behave like vLLM < 0.10.2: no token_ids in answers
    scripted: Path | None = None # answer with the scripted completions in this file (llm/scripted.py)
    logprobs_mode: str | None = None   # raw | processed for every endpoint; None: each endpoint's stock kind
    reload_delay_s: float = 0.0        # a weight reload holds generation this much longer (a large model's load)


class ReferenceServer:
    def __init__(self, options: ServerOptions) -> None:
        from transformers import AutoTokenizer

        self.options = options
        self.model_id = str(options.model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(options.model_dir), local_files_only=True)
        self.engine = self._engine(options)
        self.weight_version = options.weight_version   # moved by a reload (orchestrator/devserver/reload.py)
        self._record = open(options.record, "ab") if options.record else None

    def _engine(self, options: ServerOptions) -> Any:
        if options.scripted is not None:
            from orchestrator.devserver.scripted import scripted_engine

            return scripted_engine(options.scripted, self.tokenizer)
        return Engine(options.model_dir, max_batch=options.max_batch, threads=options.threads,
                      reload_delay_s=options.reload_delay_s)

    def close(self) -> None:
        if self._record is not None:
            self._record.close()

    # -- helpers --------------------------------------------------------------------------
    def check_prompt(self, ids: Any) -> list[int]:
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            raise web.HTTPBadRequest(text="prompt must be a non-empty list of token ids")
        vocab = len(self.tokenizer)
        if any(i < 0 or i >= vocab for i in ids):
            raise web.HTTPBadRequest(text=f"token id out of range [0, {vocab})")
        if len(ids) >= self.options.max_model_len:
            raise web.HTTPBadRequest(
                text=f"This model's maximum context length is {self.options.max_model_len} tokens; "
                     f"the prompt has {len(ids)}"
            )
        return ids

    def budget(self, prompt: list[int], wanted: Any) -> int:
        wanted = 16 if wanted is None else int(wanted)
        return max(0, min(wanted, self.options.max_model_len - len(prompt)))

    async def generate(self, endpoint: str, prompt: list[int], request: GenRequest, rid: str | None = None) -> GenResult:
        try:
            result = await self.engine.submit(request, rid)
        except ValueError as exc:  # e.g. no scripted completion matches the prompt
            raise web.HTTPBadRequest(text=str(exc)) from None
        if self._record is not None:
            logprobs = self.served_logprobs(endpoint, result)
            line = {"time": time.time(), "endpoint": endpoint, "prompt_ids": prompt,
                    "output_ids": result.output_ids, "logprobs": logprobs,
                    "finish_reason": result.finish_reason}
            self._record.write(orjson.dumps(line) + b"\n")
            self._record.flush()
        return result

    def served_logprobs(self, endpoint: str, result: GenResult) -> list[float]:
        """The kind of logprobs this endpoint answers with (see the module doc)."""
        mode = self.options.logprobs_mode or ("processed" if endpoint == "/generate" else "raw")
        return result.processed_logprobs if mode == "processed" else result.raw_logprobs

    def announced(self) -> dict[str, str]:
        return {"logprobs_mode": self.options.logprobs_mode} if self.options.logprobs_mode else {}

    # -- routes ---------------------------------------------------------------------------
    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.model_id, "object": "model", "owned_by": "hpc-rollout",
            "max_model_len": self.options.max_model_len, **self.announced()}]})

    async def metrics(self, _: web.Request) -> web.Response:
        """A little of vLLM's Prometheus page: the requests in flight (queued ones included); and
        the model thread's steps (serve_llm:*, a scripted policy has none): their count, the rows
        they carried, their wall and CPU seconds."""
        label = f'{{model_name="{self.model_id}"}}'
        text = (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{label} {self.engine.in_flight()}\n"
                f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{label} 0\n")
        counters = getattr(self.engine, "counters", None)
        if counters is not None:
            for name, value in (("steps_total", counters.steps), ("step_rows_total", counters.rows),
                                ("step_seconds_total", counters.seconds), ("step_cpu_seconds_total", counters.cpu_seconds)):
                text += f"# TYPE serve_llm:{name} counter\nserve_llm:{name}{label} {value}\n"
        return web.Response(text=text, content_type="text/plain")

    async def model_info(self, _: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model_id, "is_generation": True,
                                  "weight_version": self.weight_version, **self.announced()})

    async def completions(self, http: web.Request) -> web.Response:
        body = await read_body(http)
        if body.get("model") not in (None, self.model_id):
            raise web.HTTPNotFound(text=f"The model `{body.get('model')}` does not exist.")
        if int(body.get("n", 1)) != 1:
            raise web.HTTPBadRequest(text="this reference server supports n=1 only")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        prompt = self.check_prompt(prompt)
        request = gen_request(prompt, self.budget(prompt, body.get("max_tokens")), body)
        result = await self.generate("/v1/completions", prompt, request)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        choice: dict[str, Any] = {
            "index": 0, "text": self.tokenizer.decode(result.output_ids),
            "finish_reason": result.finish_reason, "stop_reason": result.matched_stop,
            "logprobs": None,
        }
        if body.get("logprobs") is not None:
            tokens = [f"token_id:{i}" if as_ids else self.tokenizer.decode([i]) for i in result.output_ids]
            logprobs = self.served_logprobs("/v1/completions", result)
            choice["logprobs"] = {
                "text_offset": [], "token_logprobs": [max(lp, -9999.0) for lp in logprobs],
                "tokens": tokens, "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs)],
            }
        if body.get("return_token_ids") and not self.options.legacy_vllm:
            choice["token_ids"] = result.output_ids
            choice["prompt_token_ids"] = prompt
        return web.json_response({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": self.model_id, "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(result.output_ids),
                      "total_tokens": len(prompt) + len(result.output_ids)},
        })

    async def sglang_generate(self, http: web.Request) -> web.Response:
        body = await read_body(http)
        inputs = body.get("input_ids")
        batch = isinstance(inputs, list) and bool(inputs) and isinstance(inputs[0], list)
        given = inputs if isinstance(inputs, list) and batch else [inputs]
        prompts = [self.check_prompt(p) for p in given]
        params = body.get("sampling_params") or {}
        given_rid = body.get("rid")
        rids = [given_rid] if not batch else [None] * len(prompts) if given_rid is None else given_rid
        if not isinstance(rids, list) or len(rids) != len(prompts) or not all(r is None or isinstance(r, str) for r in rids):
            raise web.HTTPBadRequest(text="rid must be a string (a list of strings for a batch of input_ids)")
        answers = await asyncio.gather(*(self._one_sglang(p, params, body, r) for p, r in zip(prompts, rids)))
        return web.json_response(answers if batch else answers[0])

    async def _one_sglang(self, prompt: list[int], params: dict[str, Any], body: dict[str, Any],
                          rid: str | None) -> dict[str, Any]:
        request = gen_request(prompt, self.budget(prompt, params.get("max_new_tokens", 128)), params)
        result = await self.generate("/generate", prompt, request, rid)
        finish: dict[str, Any] = (
            {"type": "stop", "matched": result.matched_stop} if result.finish_reason == "stop"
            else {"type": "abort", "message": "aborted by /abort_request"} if result.finish_reason == "abort"
            else {"type": "length", "length": len(result.output_ids)}
        )
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex, "finish_reason": finish, "prompt_tokens": len(prompt),
            "completion_tokens": len(result.output_ids), "cached_tokens": 0,
            "weight_version": self.weight_version,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [
                [lp, i, None] for lp, i in zip(self.served_logprobs("/generate", result), result.output_ids)
            ]
        return {"text": self.tokenizer.decode(result.output_ids), "output_ids": result.output_ids,
                "meta_info": meta}

    async def abort_requests(self, http: web.Request) -> web.Response:
        """vLLM's dev-mode route: no `request_ids` aborts every request in flight."""
        body = await read_body(http)
        if body.get("request_ids"):
            raise web.HTTPBadRequest(text="this server aborts every request in flight only: send no request_ids")
        return web.json_response({"status": "aborted", "aborted": self.engine.abort_all()})

    async def abort_request(self, http: web.Request) -> web.Response:
        """SGLang's route: {"abort_all": true} aborts every request in flight, {"rid": ID} the /generate
        sent with that rid (none in flight: nothing to do); 200 with no body."""
        body = await read_body(http)
        rid = body.get("rid")
        if body.get("abort_all"):
            log.info("aborted %d generation(s)", self.engine.abort_all())
        elif isinstance(rid, str) and rid:
            self.engine.abort(rid)
        else:
            raise web.HTTPBadRequest(text='send {"abort_all": true}, or {"rid": ID} of a /generate request')
        return web.Response(status=200)

    async def tokenize(self, http: web.Request) -> web.Response:
        body = await read_body(http)
        if "messages" in body:
            ids = self.tokenizer.apply_chat_template(
                body["messages"], tokenize=True, add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                return_dict=False)
        else:
            ids = self.tokenizer.encode(str(body.get("prompt", "")),
                                        add_special_tokens=bool(body.get("add_special_tokens", True)))
        return web.json_response({"count": len(ids), "max_model_len": self.options.max_model_len,
                                  "tokens": list(ids)})

    async def detokenize(self, http: web.Request) -> web.Response:
        body = await read_body(http)
        return web.json_response({"prompt": self.tokenizer.decode(body.get("tokens") or [])})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes([
            web.get("/health", self.health), web.get("/v1/models", self.models), web.get("/metrics", self.metrics),
            web.get("/model_info", self.model_info), web.get("/get_model_info", self.model_info),
            web.post("/v1/completions", self.completions), web.post("/generate", self.sglang_generate),
            web.post("/tokenize", self.tokenize), web.post("/detokenize", self.detokenize),
            web.post("/abort_requests", self.abort_requests), web.post("/abort_request", self.abort_request),
        ])
        add_reload_routes(app, self)
        return app


def gen_request(prompt: list[int], budget: int, params: dict[str, Any]) -> GenRequest:
    try:
        return GenRequest(
            prompt_ids=tuple(prompt), max_tokens=budget,
            temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1) or -1),
            seed=int(params["seed"]) if params.get("seed") is not None else None,
            stop_token_ids=tuple(int(i) for i in params.get("stop_token_ids") or ()),
            ignore_eos=bool(params.get("ignore_eos", False)),
        )
    except (TypeError, ValueError) as exc:
        raise web.HTTPBadRequest(text=f"bad sampling parameter: {exc}") from None


async def serve(options: ServerOptions) -> None:
    """Serve until SIGTERM, SIGINT or SIGHUP (unless ignored, as under nohup). Prints `serving on URL`
    once listening (port 0 = any free) and answering those signals."""
    server = ReferenceServer(options)
    # handler_cancellation: a client that disconnects cancels its handler (aiohttp's default since
    # 3.7 lets it run on), and so aborts its generation, as vLLM and SGLang abort a disconnected request.
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, options.host, options.port)
    await site.start()
    port = runner.addresses[0][1]
    # Listening on every interface: print the name other nodes reach this one by.
    host = socket.gethostname() if options.host in ("0.0.0.0", "::", "") else options.host
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    hangup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    for sig in (signal.SIGTERM, signal.SIGINT, *hangup):   # before the line that says it is ready
        loop.add_signal_handler(sig, stop.set)
    print(f"serving {server.model_id} on http://{host}:{port}/v1", flush=True)
    try:
        await stop.wait()
    finally:
        # As vLLM does at shutdown: requests in flight end now, answered with what they sampled
        # (finish_reason "abort"); cleanup() would otherwise wait for each to run to its end.
        server.engine.abort_all()
        await runner.cleanup()
        server.close()
        with contextlib.suppress(OSError):   # after SIGHUP the terminal may be gone (EIO)
            print("server stopped", file=sys.stderr, flush=True)
