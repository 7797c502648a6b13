"""The harness side of benchmarks.proxy: a process of its own with a blocking stdlib HTTP client
(keep-alive), as a CLI agent would be. Standard library only.

    python proxy_client.py --unix DIR/proxy.sock --token TOKEN    # straight to the proxy's socket
    python proxy_client.py                                        # OPENAI_BASE_URL / OPENAI_API_KEY (the relay)

It holds a growing tool-calling conversation. For each line the benchmark writes on stdin it
makes the next call and answers on stdout with the call's time in ms (request out, JSON answer
parsed); the body is built before the clock starts, as the benchmark's direct call gets its ids
ready-made. An empty line or EOF ends it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import time
from urllib.parse import urlsplit

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
SAMPLING = {"max_tokens": 128, "temperature": 1.0}
FIRST_MESSAGES = [{"role": "system", "content": "You use tools."}, {"role": "user", "content": "Benchmark overhead."}]


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("proxy", timeout=300)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)

# tests/test_benchmarks.py runs every program here but this one (it is a part of another)
NOT_A_BENCHMARK = "the harness-side client process that benchmarks.proxy starts"


def tool_output(index: int) -> str:
    return f"total {index}\n" + "-rw-r--r-- 1 agent agent 4096 file\n" * 8


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unix", help="the proxy's socket (default: OPENAI_BASE_URL over TCP)")
    parser.add_argument("--token", default=os.environ.get("OPENAI_API_KEY", ""))
    args = parser.parse_args()
    if args.unix:
        connection: http.client.HTTPConnection = UnixConnection(args.unix)
        prefix = "/v1"
    else:
        base = urlsplit(os.environ["OPENAI_BASE_URL"])
        connection = http.client.HTTPConnection(base.hostname or "127.0.0.1", base.port, timeout=300)
        prefix = base.path.rstrip("/")
    headers = {"Authorization": f"Bearer {args.token}", "Content-Type": "application/json"}
    messages = list(FIRST_MESSAGES)
    index = 0
    for line in sys.stdin:
        if not line.strip():
            break
        body = json.dumps({"model": "policy", "messages": messages, "tools": TOOLS, **SAMPLING}).encode()
        began = time.perf_counter()
        connection.request("POST", prefix + "/chat/completions", body, headers)
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            print(f"error {response.status} {data[:300]!r}", flush=True)
            return 1
        answer = json.loads(data)
        elapsed_ms = (time.perf_counter() - began) * 1000
        reply = answer["choices"][0]["message"]
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": tool_output(index)}]
        index += 1
        print(f"{elapsed_ms:.4f}", flush=True)
    connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
