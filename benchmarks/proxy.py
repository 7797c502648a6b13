"""The recording proxy's costs and what prefix merging saves.

    python -m benchmarks.proxy [--calls 40]

  proxy_overhead_median_ms  per call: (a blocking stdlib HTTP client, in its own thread as a harness
                            would be in its own process -> proxy on its Unix socket -> backend) minus (the
                            same prompt ids sent straight to the backend through the job's LLM
                            session), measured call by call, interleaved, on a growing tool-calling
                            conversation; a real scripted serve-llm answers both (target <= 3 ms)
  proxy_inside_median_ms    the proxy's own work per call (messages -> ids, reply parsing), from its record
  instant_round_trip_*      client -> proxy -> a backend that answers at once -> client (the path's floor)
  merge_ratio               sequences trained on with prefix_merging / with per_request, over the
                            bundled harness runs: the tests' stdlib harness (tests/proxy/harness/
                            toy_agent.py) through the in-sandbox relay program (run on the host here)
                            on the 20 bundled math problems, as is and with its first exchange dropped
                            at the third call
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, median, percentile, print_table
from hpc_rollout.handlers.bundled.math_problems import PROBLEMS
from orchestrator.agent.parsers import get_parser
from orchestrator.llm.local_server import start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.router import router_for
from orchestrator.llm.session import LLMSession, Turn
from orchestrator.llm.tiny_model import load_tokenizer, tiny_model_dir
from orchestrator.paths import SpoolPaths
from orchestrator.proxy.recorder import CallRecorder, ProxyLimits
from orchestrator.proxy.server import RELAY_NAME, JobProxy, new_proxy_dir, read_token
from orchestrator.proxy.trajectory import Builder, build_samples
from orchestrator.spool import init_run

TOY_AGENT = Path(__file__).resolve().parents[1] / "tests" / "proxy" / "harness" / "toy_agent.py"
BASH = [{"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
SAMPLING = {"max_tokens": 128, "temperature": 1.0}


def bash_call(command: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


def scripts(calls: int) -> list[dict[str, Any]]:
    overhead = {"match": "Benchmark overhead.", "replies": [bash_call(f"ls -la /tmp/dir{i}") for i in range(calls + 1)]}
    math = [{"match": problem, "replies": [bash_call(f"echo step {i}") for i in range(3)] + [f"\\boxed{{{answer}}}"]}
            for problem, answer, *_ in PROBLEMS]
    return [overhead, *math]


class UnixHTTP:
    """A harness-like blocking HTTP/1.1 client (the standard library's, keep-alive) over the socket."""

    def __init__(self, path: Path, token: str) -> None:
        self.path, self.token = str(path), token
        self.connection = http.client.HTTPConnection("proxy", timeout=120)
        self.connection.connect = self._connect  # type: ignore[method-assign]

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        self.connection.sock = sock

    def post(self, path: str, body: bytes) -> Any:
        self.connection.request("POST", path, body, {"Authorization": f"Bearer {self.token}",
                                                     "Content-Type": "application/json"})
        response = self.connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"proxy answered {response.status}: {data[:300]!r}")
        return json.loads(data)

    def close(self) -> None:
        self.connection.close()


def new_recorder(llm: LLMSession, tokenizer: Any) -> CallRecorder:
    return CallRecorder(llm, tokenizer, get_parser("hermes"), dict(SAMPLING), ProxyLimits(200, 30000, 256))


async def conversation(llm: LLMSession, tmp: Path, calls: int, direct: LLMSession | None = None,
                       bodies: list[bytes] | None = None) -> tuple[CallRecorder, list[bytes], list[float]]:
    """One tool-calling conversation through a fresh proxy. With `direct` and the `bodies` of an
    earlier identical pass (scripted replies: the same messages, the same ids), each call is also
    sent straight to the backend, before the proxied one on even calls and after it on odd ones
    (whichever goes first wakes the backend up: alternating cancels that out)."""
    recorder = new_recorder(llm, await llm.tokenizer())
    directory = new_proxy_dir(tmp / "px")
    sent: list[bytes] = []
    added: list[float] = []
    async with JobProxy(recorder, directory):
        client = UnixHTTP(directory / "proxy.sock", read_token(directory))
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You use tools."},
                                          {"role": "user", "content": "Benchmark overhead."}]
        try:
            for index in range(calls):
                body = json.dumps({"model": "policy", "messages": messages, "tools": BASH, **SAMPLING}).encode()
                sent.append(body)
                straight = 0.0
                if direct is not None and bodies is not None and index % 2 == 0:
                    straight = await timed_direct(direct, bodies, index)
                began = time.perf_counter()
                answer = await asyncio.to_thread(client.post, "/v1/chat/completions", body)
                proxied = time.perf_counter() - began
                if direct is not None and bodies is not None and index % 2 == 1:
                    straight = await timed_direct(direct, bodies, index)
                added.append((proxied - straight) * 1000)
                reply = answer["choices"][0]["message"]
                messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                                     "content": f"total {index}\n" + "-rw-r--r-- 1 agent agent 4096 file\n" * 8}]
        finally:
            client.close()
    assert all(c["extended"] for c in recorder.calls[1:]), "the benchmark conversation must extend itself"
    return recorder, sent, added


PROMPTS: dict[int, list[int]] = {}


class InstantBackend:
    """An LLM session that answers at once with the same tool call: the proxy path alone."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer_ = tokenizer
        self.reply = list(tokenizer.encode(bash_call("ls -la /tmp"), add_special_tokens=False)) + [tokenizer.eos_token_id]

    async def tokenizer(self) -> Any:
        return self.tokenizer_

    async def generate(self, prompt_ids: list[int], sampling: dict[str, Any] | None = None) -> Turn:
        return Turn(list(prompt_ids), list(self.reply), [0.0] * len(self.reply), "instant", 0, "stop", "raw")


async def timed_direct(direct: LLMSession, bodies: list[bytes], index: int) -> float:
    began = time.perf_counter()
    await direct.generate(PROMPTS[index], dict(SAMPLING))
    return time.perf_counter() - began


async def instant_path(tmp: Path, calls: int, tokenizer: Any) -> list[float]:
    """Client -> proxy -> an instant backend -> client, per call (ms): the floor of the path."""
    _, _, round_trips = await conversation(InstantBackend(tokenizer), tmp, calls)  # type: ignore[arg-type]
    return round_trips


async def overhead(paths: SpoolPaths, tmp: Path, calls: int) -> tuple[list[float], list[float]]:
    router = router_for(paths, "bench-overhead")
    async with LLMSession(router, job_id="warm-up") as llm:
        first, bodies, _ = await conversation(llm, tmp, calls)
    PROMPTS.update({i: c["input_ids"] for i, c in enumerate(first.calls)})
    async with LLMSession(router, job_id="proxied") as llm, LLMSession(router, job_id="direct") as direct:
        recorder, sent, added = await conversation(llm, tmp, calls, direct, bodies)
    assert sent == bodies and [c["input_ids"] for c in recorder.calls] == [c["input_ids"] for c in first.calls]
    return added, [c["proxy_ms"] for c in recorder.calls]


async def harness_runs(paths: SpoolPaths, tmp: Path) -> list[dict[str, Any]]:
    """Each bundled math problem through the toy harness, as is and with a dropped exchange."""
    router = router_for(paths, "bench-merge")
    runs = []
    for index, (problem, *_rest) in enumerate(PROBLEMS):
        for drop in (False, True):
            async with LLMSession(router, job_id=f"merge-{index}-{drop}") as llm:
                recorder = new_recorder(llm, await llm.tokenizer())
                directory = new_proxy_dir(tmp / "px")
                task = tmp / f"task-{index}.md"
                task.write_text(problem)
                async with JobProxy(recorder, directory):
                    process = await asyncio.create_subprocess_exec(
                        sys.executable, "-I", str(directory / RELAY_NAME), "--dir", str(directory), "--host", "127.0.0.1",
                        "--", sys.executable, str(TOY_AGENT), *(["--drop-at", "2"] if drop else []),
                        env={**os.environ, "HPC_ROLLOUT_TASK_FILE": str(task)},
                        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
                    _, err = await process.communicate()
                    if process.returncode != 0:
                        raise RuntimeError(f"toy harness failed on {problem!r}: {err.decode()[-500:]}")
            runs.append({"problem": index, "drop": drop, "calls": recorder.calls})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description="The recording proxy: overhead per call and merge ratio.")
    parser.add_argument("--calls", type=int, default=40, help="calls of the overhead conversation")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    script_file = tmp / "scripts.jsonl"
    script_file.write_text("".join(json.dumps(s) + "\n" for s in scripts(args.calls)))
    server = start_server(tiny=True, extra_args=["--scripted", str(script_file), "--max-model-len", "32768"])
    try:
        paths, _ = init_run(tmp / "run")
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=0)
        added, inside = asyncio.run(overhead(paths, tmp, args.calls))
        tokenizer = load_tokenizer(str(tiny_model_dir()))
        instant = asyncio.run(instant_path(tmp, args.calls, tokenizer))
        runs = asyncio.run(harness_runs(paths, tmp))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print_table("proxy overhead per call (ms): proxied minus direct, same prompt ids",
                ["figure", "median", "p90", "calls"],
                [["added by the proxy", median(added), percentile(added, 0.9), len(added)],
                 ["inside the proxy (render + parse)", median(inside), percentile(inside, 0.9), len(inside)],
                 ["round trip with an instant backend", median(instant), percentile(instant, 0.9), len(instant)]])
    load = os.getloadavg()[0]
    print(f"  (load average {load:.1f} on {os.cpu_count()} cores: on a busy machine waits for a core dominate)")
    rows = []
    totals = {Builder.PER_REQUEST: 0, Builder.PREFIX_MERGING: 0}
    for drop in (False, True):
        chosen = [r for r in runs if r["drop"] is drop]
        counts = {b: sum(len(build_samples(r["calls"], b)) for r in chosen) for b in totals}
        for builder, count in counts.items():
            totals[builder] += count
        rows.append(["drops its first exchange" if drop else "keeps its history", len(chosen),
                     counts[Builder.PER_REQUEST], counts[Builder.PREFIX_MERGING],
                     counts[Builder.PREFIX_MERGING] / counts[Builder.PER_REQUEST]])
    merge_ratio = totals[Builder.PREFIX_MERGING] / totals[Builder.PER_REQUEST]
    rows.append(["all", len(runs), totals[Builder.PER_REQUEST], totals[Builder.PREFIX_MERGING], merge_ratio])
    print_table("sequences to train on, bundled math problems through the toy harness",
                ["harness", "runs", "per_request", "prefix_merging", "ratio"], rows)
    emit_json({"proxy_overhead_median_ms": round(median(added), 3), "proxy_overhead_p90_ms": round(percentile(added, 0.9), 3),
               "proxy_inside_median_ms": round(median(inside), 3),
               "instant_round_trip_median_ms": round(median(instant), 3),
               "instant_round_trip_p10_ms": round(percentile(instant, 0.1), 3), "load_average": round(load, 2), "merge_ratio": round(merge_ratio, 4),
               "calls_per_request": totals[Builder.PER_REQUEST], "sequences_prefix_merging": totals[Builder.PREFIX_MERGING],
               "target_overhead_ms": 3.0})


if __name__ == "__main__":
    main()
