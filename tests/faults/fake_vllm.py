"""A scripted stand-in for vLLM's token-in/token-out /v1/completions, as a real process.

    python -m tests.faults.fake_vllm --port 0 [--mode ok|poison|hang] [--poison-token N]

It prints `serving on http://127.0.0.1:PORT/v1` and answers:
  GET  /health          200 (also in `hang` mode: a hung engine that still says it is healthy)
  GET  /v1/models       one model, max_model_len 4096
  POST /v1/completions  `ok`: ids continuing the prompt ((last + k) % 1000 + 100);
                        `poison`: ids [5, N] (N does not fit the int32 column of a row),
                        also in `ok` mode for a request whose sampling seed is POISON_SEED;
                        `hang`: never answers;
                        `trickle`: answers at once but sends one byte a second, taking
                        TRICKLE_S in all (a backend a per-read timeout never gives up on)
  POST /control         {"mode": ...} switches the mode of the running server

A separate process, so a test can kill it (a real outage) and start it again on the same port.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

MODES = ("ok", "poison", "hang", "trickle")
POISON_SEED = 666
TRICKLE_S = 30


def build_app(mode: str, poison_token: int) -> Any:
    from aiohttp import web

    state = {"mode": mode}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if state["mode"] == "hang":
            await asyncio.sleep(3600)
        if state["mode"] == "trickle":
            return await trickle(request, body)
        prompt = body["prompt"]
        count = min(int(body.get("max_tokens", 8)), 8)
        if state["mode"] == "poison" or body.get("seed") == POISON_SEED:
            ids = [5, poison_token]
        else:
            ids = [(prompt[-1] + k) % 1000 + 100 for k in range(1, count + 1)]
        choice = {
            "index": 0, "text": "", "token_ids": ids, "finish_reason": "length",
            "logprobs": {"token_logprobs": [-0.5] * len(ids), "tokens": [f"token_id:{i}" for i in ids]},
        }
        return web.json_response({"id": "c", "object": "text_completion", "choices": [choice]})

    async def trickle(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        """Whitespace (valid JSON padding), one byte a second, then a real answer."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for _ in range(TRICKLE_S):
            await response.write(b" ")
            await asyncio.sleep(1.0)
        ids = [(body["prompt"][-1] + 1) % 1000 + 100]
        await response.write(orjson.dumps({"id": "c", "object": "text_completion", "choices": [{
            "index": 0, "text": "", "token_ids": ids, "finish_reason": "length",
            "logprobs": {"token_logprobs": [-0.5], "tokens": [f"token_id:{i}" for i in ids]}}]}))
        await response.write_eof()
        return response

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "max_model_len": 4096}]})

    async def control(request: web.Request) -> web.Response:
        wanted = (await request.json()).get("mode")
        if wanted not in MODES:
            return web.Response(status=400, text=f"mode must be one of {', '.join(MODES)}")
        state["mode"] = wanted
        return web.json_response(state)

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.get("/health", health),
                    web.get("/v1/models", models), web.post("/control", control)])
    return app


def main() -> None:
    from aiohttp import web

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--poison-token", type=int, default=3_000_000_000)
    args = parser.parse_args()

    async def serve() -> None:
        runner = web.AppRunner(build_app(args.mode, args.poison_token), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port, reuse_address=True)
        await site.start()
        port = runner.addresses[0][1]
        print(f"serving on http://127.0.0.1:{port}/v1", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(serve())


@dataclass
class FakeVLLM:
    """A running fake server process; `stop()` / `start()` make a real outage on the same port."""

    mode: str = "ok"
    port: int = 0
    process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 60) -> "FakeVLLM":
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}
        deadline = time.monotonic() + timeout_s
        while True:  # the port of a stopped server may take a moment to be free again
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.fake_vllm", "--port", str(self.port), "--mode", self.mode],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True, env=env,
            )
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            if line.startswith("serving on "):
                self.port = int(line.rsplit(":", 1)[1].split("/")[0])
                return self
            self.process.wait(10)
            if time.monotonic() > deadline:
                raise RuntimeError(f"fake vLLM did not start on port {self.port}")
            time.sleep(0.2)

    def set_mode(self, mode: str) -> None:
        httpx.post(f"http://127.0.0.1:{self.port}/control", json={"mode": mode}, timeout=10).raise_for_status()
        self.mode = mode

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> "FakeVLLM":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


if __name__ == "__main__":
    main()
