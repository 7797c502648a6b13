"""A stand-in for `python -m vllm.entrypoints.openai.api_server` in the sbatch template tests.

It answers /health, /v1/models and a one-token /v1/completions (the template's readiness
check) on --port and exits on SIGTERM, like the real server does; no model, no GPU. The vllm
template's start-up, registration and signal handling are what is under test, not vLLM
(tests/vllm runs the same template with the real server).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    model = "stub"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == "/health":
            body = b""
        elif self.path == "/v1/models":
            body = json.dumps({"data": [{"id": self.model}]}).encode()
        else:
            self.send_error(404)
            return
        self._send(body)

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/v1/completions":
            self.send_error(404)
            return
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        choice = {"index": 0, "text": "", "finish_reason": "length", "token_ids": [1],
                  "logprobs": {"token_logprobs": [-0.5], "tokens": ["token_id:1"]}}
        self._send(json.dumps({"choices": [choice]}).encode())

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    args, _ = parser.parse_known_args()
    Handler.model = args.model
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"stub vllm serving {args.model} on {args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
