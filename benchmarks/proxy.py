"""The recording proxy's costs and what prefix merging saves.

    python -m benchmarks.proxy [--calls 40]

  proxy_overhead_median_ms  per call: (a blocking stdlib HTTP client in a process of its own, as a
                            harness is (benchmarks/proxy_client.py) -> proxy on its Unix socket ->
                            backend) minus (the same prompt ids sent straight to the backend through
                            the job's LLM session), measured call by call, interleaved, on a growing
                            tool-calling conversation; a real scripted serve-llm answers both (target
                            <= 3 ms). Also, side by side: `relay` (the client over TCP through the
                            in-sandbox relay, run on the host: the whole path a harness sees) and
                            `thread` (the client in a thread of the benchmark's process, sharing its
                            GIL: how this figure was measured before)
  proxy_inside_median_ms    the proxy's own work per call (messages -> ids, reply parsing), from its record
  proxy_cpu_added_median_ms the CPU time the worker's event loop spends on a proxied call minus on the
                            direct one (HTTP, parsing, rendering, the answer): hardly moved by load
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
import enum
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, median, parse_args, percentile, print_table
from hpc_rollout.handlers.bundled.math_problems import PROBLEMS
from orchestrator.agent.parsers import get_parser
from orchestrator.devserver.local_server import start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.router import router_for
from orchestrator.llm.session import LLMSession, Turn
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.tokenizer import load_tokenizer
from orchestrator.spool.paths import SpoolPaths
from orchestrator.proxy.recorder import CallRecorder, ProxyLimits
from orchestrator.proxy.server import RELAY_NAME, JobProxy, new_proxy_dir, read_token
from orchestrator.proxy.trajectory import Builder, build_samples
from orchestrator.spool.rundir import init_run

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


def new_recorder(llm: LLMSession, tokenizer: Any) -> CallRecorder:
    return CallRecorder(llm, tokenizer, get_parser("hermes"), dict(SAMPLING), ProxyLimits(200, 30000, 256))


CLIENT = Path(__file__).with_name("proxy_client.py")


class Client(enum.Enum):
    """Where the harness-like client sits (figures for each, side by side)."""

    PROCESS = "process"      # a process of its own, straight on the proxy's socket
    RELAY = "relay"          # a process of its own, over TCP through the in-sandbox relay (run on the host)
    THREAD = "thread"        # a thread of the benchmark's process on the socket (shares its GIL; the old figure)


class ThreadClient:
    """The client in a thread of this process (stdlib blocking HTTP on the socket)."""

    def __init__(self, path: Path, token: str) -> None:
        from benchmarks.proxy_client import FIRST_MESSAGES, UnixConnection

        self.connection = UnixConnection(str(path))
        self.token = token
        self.messages = list(FIRST_MESSAGES)

    def call(self) -> float:
        from benchmarks.proxy_client import tool_output

        body = json.dumps({"model": "policy", "messages": self.messages, "tools": BASH, **SAMPLING}).encode()
        began = time.perf_counter()
        self.connection.request("POST", "/v1/chat/completions", body,
                                {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        response = self.connection.getresponse()
        answer = json.loads(response.read())
        elapsed = (time.perf_counter() - began) * 1000
        reply = answer["choices"][0]["message"]
        index = len(self.messages) // 2 - 1
        self.messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                                  "content": tool_output(index)}]
        return elapsed

    async def next_call(self) -> float:
        return await asyncio.to_thread(self.call)

    async def close(self) -> None:
        self.connection.close()


class ProcessClient:
    """benchmarks/proxy_client.py in a process of its own, one call per line it is sent."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, directory: Path, via_relay: bool) -> "ProcessClient":
        client = [sys.executable, "-I", str(CLIENT)]
        if via_relay:
            command = [sys.executable, "-I", str(directory / RELAY_NAME), "--dir", str(directory),
                       "--host", "127.0.0.1", "--", *client]
        else:
            command = [*client, "--unix", str(directory / "proxy.sock"), "--token", read_token(directory)]
        process = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE,
                                                       stdout=asyncio.subprocess.PIPE)
        return cls(process)

    async def next_call(self) -> float:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()
        line = (await self.process.stdout.readline()).decode()
        try:
            return float(line)
        except ValueError:
            raise RuntimeError(f"the benchmark client failed: {line!r}") from None

    async def close(self) -> None:
        assert self.process.stdin
        self.process.stdin.close()
        if await self.process.wait() != 0:
            raise RuntimeError(f"the benchmark client exited with {self.process.returncode}")


async def conversation(llm: Any, tmp: Path, calls: int, client_kind: Client = Client.PROCESS,
                       direct: LLMSession | None = None, cpu_added: list[float] | None = None) -> tuple[CallRecorder, list[float]]:
    """One tool-calling conversation through a fresh proxy; per call, the client's time (ms), or
    with `direct` the client's time minus the same prompt ids sent straight to the backend
    (PROMPTS, from an earlier identical pass: scripted replies give the same messages and ids),
    before the proxied call on even calls and after it on odd ones (whichever goes first wakes
    the backend up: alternating cancels that out). `cpu_added` gets, per call, the CPU time this
    process's event loop (the proxy, the worker's side) spent on the proxied call minus on the
    direct one: unlike the wall clock, hardly moved by other processes' load."""
    recorder = new_recorder(llm, await llm.tokenizer())
    directory = new_proxy_dir(tmp / "px")
    added: list[float] = []
    async with JobProxy(recorder, directory):
        client: ThreadClient | ProcessClient
        if client_kind is Client.THREAD:
            client = ThreadClient(directory / "proxy.sock", read_token(directory))
        else:
            client = await ProcessClient.start(directory, client_kind is Client.RELAY)
        try:
            for index in range(calls):
                straight = straight_cpu = 0.0
                if direct is not None and index % 2 == 0:
                    straight, straight_cpu = await timed_direct(direct, index)
                cpu = time.thread_time()
                proxied_ms = await client.next_call()
                proxied_cpu = time.thread_time() - cpu
                if direct is not None and index % 2 == 1:
                    straight, straight_cpu = await timed_direct(direct, index)
                added.append(proxied_ms - straight * 1000)
                if cpu_added is not None:
                    cpu_added.append((proxied_cpu - straight_cpu) * 1000)
        finally:
            await client.close()
    shutil.rmtree(directory, ignore_errors=True)
    assert all(c["extended"] for c in recorder.calls[1:]), "the benchmark conversation must extend itself"
    return recorder, added


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


async def timed_direct(direct: LLMSession, index: int) -> tuple[float, float]:
    """(wall, CPU of this thread) of one direct call, in seconds."""
    began, cpu = time.perf_counter(), time.thread_time()
    await direct.generate(PROMPTS[index], dict(SAMPLING))
    return time.perf_counter() - began, time.thread_time() - cpu


async def instant_path(tmp: Path, calls: int, tokenizer: Any, client: Client) -> list[float]:
    """Client -> proxy -> an instant backend -> client, per call (ms): the floor of the path."""
    _, round_trips = await conversation(InstantBackend(tokenizer), tmp, calls, client)
    return round_trips


async def overhead(paths: SpoolPaths, tmp: Path, calls: int, client: Client,
                   cpu_added: list[float]) -> tuple[list[float], list[float]]:
    router = router_for(paths, "bench-overhead")
    if not PROMPTS:
        async with LLMSession(router, job_id="warm-up") as llm:
            first, _ = await conversation(llm, tmp, calls)
        PROMPTS.update({i: c["input_ids"] for i, c in enumerate(first.calls)})
    async with LLMSession(router, job_id="proxied") as llm, LLMSession(router, job_id="direct") as direct:
        recorder, added = await conversation(llm, tmp, calls, client, direct, cpu_added)
    assert [c["input_ids"] for c in recorder.calls] == [PROMPTS[i] for i in range(calls)], "same prompts as the warm-up"
    return added, [c["proxy_ms"] for c in recorder.calls]


async def harness_runs(paths: SpoolPaths, tmp: Path, problems: int) -> list[dict[str, Any]]:
    """The first `problems` bundled math problems through the toy harness, as is and with a dropped exchange."""
    router = router_for(paths, "bench-merge")
    runs = []
    for index, (problem, *_rest) in enumerate(PROBLEMS[:problems]):
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


# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"calls": 4, "rounds": 1, "problems": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description="The recording proxy: overhead per call and merge ratio.")
    parser.add_argument("--calls", type=int, default=40, help="calls of each overhead conversation")
    parser.add_argument("--rounds", type=int, default=3, help="conversations per client kind, interleaved")
    parser.add_argument("--clients", default=",".join(c.value for c in Client),
                        help=f"client kinds to measure, comma-separated: {', '.join(c.value for c in Client)}")
    parser.add_argument("--no-merge", action="store_true", help="skip the merge_ratio runs")
    parser.add_argument("--problems", type=int, default=len(PROBLEMS), help="bundled math problems of the merge_ratio runs")
    args = parse_args(parser, QUICK)
    kinds = [Client(k) for k in args.clients.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    script_file = tmp / "scripts.jsonl"
    script_file.write_text("".join(json.dumps(s) + "\n" for s in scripts(args.calls)))
    server = start_server(tiny=True, extra_args=["--scripted", str(script_file), "--max-model-len", "32768"])
    added: dict[Client, list[float]] = {k: [] for k in kinds}
    inside: dict[Client, list[float]] = {k: [] for k in kinds}
    instant: dict[Client, list[float]] = {k: [] for k in kinds}
    cpu: dict[Client, list[float]] = {k: [] for k in kinds}
    loads = [os.getloadavg()[0]]
    try:
        paths, _ = init_run(tmp / "run")
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=0)
        tokenizer = load_tokenizer(str(tiny_model_dir()))
        for _ in range(args.rounds):
            for kind in kinds:
                more_added, more_inside = asyncio.run(overhead(paths, tmp, args.calls, kind, cpu[kind]))
                added[kind] += more_added
                inside[kind] += more_inside
                instant[kind] += asyncio.run(instant_path(tmp, args.calls, tokenizer, kind))
            loads.append(os.getloadavg()[0])
        runs = [] if args.no_merge else asyncio.run(harness_runs(paths, tmp, args.problems))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    load = sum(loads) / len(loads)
    table = []
    for kind in kinds:
        table += [[f"{kind.value}: added by the proxy", median(added[kind]), percentile(added[kind], 0.9), len(added[kind])],
                  [f"{kind.value}: round trip, instant backend", median(instant[kind]), percentile(instant[kind], 0.9),
                   len(instant[kind])],
                  [f"{kind.value}: inside the proxy (render + parse)", median(inside[kind]), percentile(inside[kind], 0.9),
                   len(inside[kind])],
                  [f"{kind.value}: CPU added on the worker's side", median(cpu[kind]), percentile(cpu[kind], 0.9),
                   len(cpu[kind])]]
    print_table("proxy overhead per call (ms): proxied minus direct, same prompt ids",
                ["figure", "median", "p90", "calls"], table)
    print(f"  (load average {load:.1f} on {os.cpu_count()} cores: on a busy machine waits for a core dominate)")
    headline = Client.PROCESS if Client.PROCESS in kinds else kinds[0]
    figures: dict[str, Any] = {
        "proxy_overhead_median_ms": round(median(added[headline]), 3),
        "proxy_overhead_p90_ms": round(percentile(added[headline], 0.9), 3),
        "proxy_inside_median_ms": round(median(inside[headline]), 3),
        "proxy_cpu_added_median_ms": round(median(cpu[headline]), 3),
        "instant_round_trip_median_ms": round(median(instant[headline]), 3),
        "instant_round_trip_p10_ms": round(percentile(instant[headline], 0.1), 3),
        "headline_client": headline.value, "load_average": round(load, 2), "target_overhead_ms": 3.0}
    for kind in kinds:
        if kind is not headline:
            figures[f"proxy_overhead_{kind.value}_median_ms"] = round(median(added[kind]), 3)
            figures[f"instant_round_trip_{kind.value}_median_ms"] = round(median(instant[kind]), 3)
    if runs:
        figures.update(merge_table(runs))
    emit_json(figures)


def merge_table(runs: list[dict[str, Any]]) -> dict[str, Any]:
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
    return {"merge_ratio": round(merge_ratio, 4), "calls_per_request": totals[Builder.PER_REQUEST],
            "sequences_prefix_merging": totals[Builder.PREFIX_MERGING]}


if __name__ == "__main__":
    main()
