"""The harness side of benchmarks.proxy: a process of its own with a blocking stdlib HTTP client
(keep-alive), as a CLI agent would be. Standard library only.

    python proxy_client.py --unix DIR/proxy.sock --token TOKEN    # straight to the proxy's socket
    python proxy_client.py                                        # OPENAI_BASE_URL / OPENAI_API_KEY (the relay)
    ... --api messages | responses                                # Anthropic Messages, OpenAI Responses

It holds a growing tool-calling conversation in the chosen API's own form (chat messages with
tool_calls and tool messages; content blocks with tool_use and tool_result; input items with
function_call and function_call_output). For each line the benchmark writes on stdin it
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
from typing import Any
from urllib.parse import urlsplit

TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
SAMPLING: dict[str, Any] = {"max_tokens": 128, "temperature": 1.0}
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


class Chat:
    path = "/chat/completions"

    def __init__(self) -> None:
        self.messages = list(FIRST_MESSAGES)

    def body(self) -> dict:
        return {"model": "policy", "messages": self.messages, "tools": TOOLS, **SAMPLING}

    def answered(self, answer: dict, output: str) -> None:
        reply = answer["choices"][0]["message"]
        self.messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": output}]


class Messages:
    path = "/messages"

    def __init__(self) -> None:
        self.messages: list = [{"role": "user", "content": FIRST_MESSAGES[1]["content"]}]

    def body(self) -> dict:
        tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                  "input_schema": t["function"]["parameters"]} for t in TOOLS]
        return {"model": "policy", "system": FIRST_MESSAGES[0]["content"], "messages": self.messages, "tools": tools,
                "max_tokens": SAMPLING["max_tokens"], "temperature": SAMPLING["temperature"]}

    def answered(self, answer: dict, output: str) -> None:
        call = next(block for block in answer["content"] if block["type"] == "tool_use")
        self.messages += [{"role": "assistant", "content": answer["content"]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": output}]}]


class Responses:
    path = "/responses"

    def __init__(self) -> None:
        self.items: list = [{"role": "user", "content": FIRST_MESSAGES[1]["content"]}]

    def body(self) -> dict:
        tools = [{"type": "function", **t["function"]} for t in TOOLS]
        return {"model": "policy", "instructions": FIRST_MESSAGES[0]["content"], "input": self.items, "tools": tools,
                "max_output_tokens": SAMPLING["max_tokens"], "temperature": SAMPLING["temperature"]}

    def answered(self, answer: dict, output: str) -> None:
        call = next(item for item in answer["output"] if item["type"] == "function_call")
        self.items += [*answer["output"], {"type": "function_call_output", "call_id": call["call_id"], "output": output}]


APIS: dict[str, type[Chat] | type[Messages] | type[Responses]] = {"chat": Chat, "messages": Messages, "responses": Responses}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unix", help="the proxy's socket (default: OPENAI_BASE_URL over TCP)")
    parser.add_argument("--token", default=os.environ.get("OPENAI_API_KEY", ""))
    parser.add_argument("--api", choices=sorted(APIS), default="chat")
    args = parser.parse_args()
    if args.unix:
        connection: http.client.HTTPConnection = UnixConnection(args.unix)
        prefix = "/v1"
    else:
        base = urlsplit(os.environ["OPENAI_BASE_URL"])
        connection = http.client.HTTPConnection(base.hostname or "127.0.0.1", base.port, timeout=300)
        prefix = base.path.rstrip("/")
    headers = {"Authorization": f"Bearer {args.token}", "Content-Type": "application/json"}
    conversation: Chat | Messages | Responses = APIS[args.api]()
    index = 0
    for line in sys.stdin:
        if not line.strip():
            break
        body = json.dumps(conversation.body()).encode()
        began = time.perf_counter()
        connection.request("POST", prefix + conversation.path, body, headers)
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            print(f"error {response.status} {data[:300]!r}", flush=True)
            return 1
        answer = json.loads(data)
        elapsed_ms = (time.perf_counter() - began) * 1000
        conversation.answered(answer, tool_output(index))
        index += 1
        print(f"{elapsed_ms:.4f}", flush=True)
    connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
