"""The recording proxy's costs and what prefix merging saves.

    python -m benchmarks.proxy [--calls 40] [--quick]

The default is the configuration a real harness job has: the harness-like client in a process of
its own, each call's `llm_call` event written to the run's event log (as handlers/harness_task.py
does), one chain extended call after call (the recorder's prefix continuation), and the
merge_ratio runs (prefix_merging over the bundled harness runs). Other modes (--clients relay /
thread, --no-merge, --no-clis, --no-events) are named in the output and the JSON line
(`configuration`, `realistic_configuration`).

  proxy_overhead_median_ms  per call (OpenAI chat completions): (a blocking stdlib HTTP client in a process of its own, as a
                            harness is (benchmarks/proxy_client.py) -> proxy on its Unix socket ->
                            backend) minus (the same prompt ids sent straight to the backend through
                            the job's LLM session), measured call by call, interleaved, on a growing
                            tool-calling conversation; a real scripted serve-llm answers both (target
                            <= 2 ms). Also, with --clients: `relay` (the client over TCP through the
                            in-sandbox relay, run on the host: the whole path a harness sees) and
                            `thread` (the client in a thread of the benchmark's process, sharing its
                            GIL: how this figure was measured before)
  proxy_overhead_median_ms_messages, proxy_overhead_median_ms_responses
                            the same figure (process client) for a conversation in the Anthropic
                            Messages and the OpenAI Responses API's own form (target <= 2 ms each)
  proxy_inside_median_ms    the proxy's own work per call (messages -> ids, reply parsing), from its record
  proxy_cpu_added_median_ms the CPU time the worker's event loop spends on a proxied call minus on the
                            direct one (HTTP, parsing, rendering, the answer, the call's event;
                            target <= 2 ms): less moved by load than the wall clock
  instant_round_trip_*      client -> proxy -> a backend that answers at once -> client (the path's floor)
  merge_ratio               sequences trained on with prefix_merging / with per_request, over the
                            bundled harness runs: the tests' stdlib harness (tests/proxy/harness/
                            toy_agent.py) through the in-sandbox relay program (run on the host here)
                            on the 20 bundled math problems, as is and with its first exchange dropped
                            at the third call
  merge_ratio_claude_code, merge_ratio_codex
                            the same for Claude Code and Codex CLI from the `harness` image, run on
                            the host (benchmarks/cli_host.py: the preset's settings, the relay, no
                            network) on bundled math problems: three shell calls, then the answer
  --quick                   8 calls, 1 round, the process client, 2 problems per harness (a smoke run)
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

from benchmarks.cli_host import prepare
from benchmarks.common import emit_json, median, parse_args, percentile, print_table
from hpc_rollout.handlers.bundled.math_problems import PROBLEMS
from hpc_rollout.handlers.harness_clis import PRESETS, CliSettings
from orchestrator.agent.parsers import get_parser
from orchestrator.devserver.local_server import start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.router import router_for
from orchestrator.llm.session import LLMSession, Turn
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.tokenizer import load_tokenizer
from orchestrator.spool.events import EventLog
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


def tool_call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


APIS = ("chat", "messages", "responses")        # benchmarks/proxy_client.py --api
CLIS = tuple(sorted(PRESETS))
SHELL_TOOLS = {"claude-code": ("Bash", "command"), "codex": ("exec_command", "cmd")}
CLI_SETTINGS = CliSettings("policy", 20, 60000, 256)


def cli_task(cli: str, problem: str) -> str:
    return f"[{cli}] {problem}"


def scripts(calls: int) -> list[dict[str, Any]]:
    overhead = {"match": "Benchmark overhead.", "replies": [bash_call(f"ls -la /tmp/dir{i}") for i in range(calls + 1)]}
    math = [{"match": problem, "replies": [bash_call(f"echo step {i}") for i in range(3)] + [f"\\boxed{{{answer}}}"]}
            for problem, answer, *_ in PROBLEMS]
    for cli in CLIS:
        tool, argument = SHELL_TOOLS[cli]
        math += [{"match": cli_task(cli, problem), "replies": [tool_call(tool, **{argument: f"echo step {i}"})
                                                                for i in range(3)] + [f"\\boxed{{{answer}}}"]}
                 for problem, answer, *_ in PROBLEMS]
    return [overhead, *math]


def new_recorder(llm: LLMSession, tokenizer: Any, events: EventLog | None = None) -> CallRecorder:
    """The job's recorder; with `events`, each call's `llm_call` event is written as a harness
    job's is (handlers/harness_task.py: one line appended to the worker's event file)."""
    recorder = CallRecorder(llm, tokenizer, get_parser("hermes"), dict(SAMPLING), ProxyLimits(200, 30000, 256))
    if events is not None:
        def note(record: dict[str, Any]) -> None:
            events.emit("bench-job", "llm_call", {
                "call": len(recorder.calls), "chain": record["chain"], "extended": record["extended"],
                "api": record["api"], "prompt_tokens": len(record["input_ids"]), "sampled": len(record["output_ids"]),
                **({"diverged": record["diverged"]} if record["diverged"] else {})})
        recorder.on_call = note
    return recorder


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
    async def start(cls, directory: Path, via_relay: bool, api: str = "chat") -> "ProcessClient":
        client = [sys.executable, "-I", str(CLIENT), "--api", api]
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
                       direct: LLMSession | None = None, cpu_added: list[float] | None = None,
                       api: str = "chat", events: EventLog | None = None) -> tuple[CallRecorder, list[float]]:
    """One tool-calling conversation through a fresh proxy; per call, the client's time (ms), or
    with `direct` the client's time minus the same prompt ids sent straight to the backend
    (PROMPTS[api], from an earlier identical pass: scripted replies give the same messages and ids),
    before the proxied call on even calls and after it on odd ones (whichever goes first wakes
    the backend up: alternating cancels that out). `cpu_added` gets, per call, the CPU time this
    process's event loop (the proxy, the worker's side) spent on the proxied call minus on the
    direct one: unlike the wall clock, hardly moved by other processes' load."""
    recorder = new_recorder(llm, await llm.tokenizer(), events)
    directory = new_proxy_dir(tmp / "px")
    added: list[float] = []
    async with JobProxy(recorder, directory):
        client: ThreadClient | ProcessClient
        if client_kind is Client.THREAD:
            client = ThreadClient(directory / "proxy.sock", read_token(directory))
        else:
            client = await ProcessClient.start(directory, client_kind is Client.RELAY, api)
        try:
            for index in range(calls):
                straight = straight_cpu = 0.0
                if direct is not None and index % 2 == 0:
                    straight, straight_cpu = await timed_direct(direct, api, index)
                cpu = time.thread_time()
                proxied_ms = await client.next_call()
                proxied_cpu = time.thread_time() - cpu
                if direct is not None and index % 2 == 1:
                    straight, straight_cpu = await timed_direct(direct, api, index)
                added.append(proxied_ms - straight * 1000)
                if cpu_added is not None:
                    cpu_added.append((proxied_cpu - straight_cpu) * 1000)
        finally:
            await client.close()
    shutil.rmtree(directory, ignore_errors=True)
    assert all(c["extended"] for c in recorder.calls[1:]), "the benchmark conversation must extend itself"
    return recorder, added


PROMPTS: dict[str, dict[int, list[int]]] = {}   # per API: the prompt ids of each call


class InstantBackend:
    """An LLM session that answers at once with the same tool call: the proxy path alone."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer_ = tokenizer
        self.reply = list(tokenizer.encode(bash_call("ls -la /tmp"), add_special_tokens=False)) + [tokenizer.eos_token_id]

    async def tokenizer(self) -> Any:
        return self.tokenizer_

    async def generate(self, prompt_ids: list[int], sampling: dict[str, Any] | None = None) -> Turn:
        return Turn(list(prompt_ids), list(self.reply), [0.0] * len(self.reply), "instant", 0, "stop", "raw")


async def timed_direct(direct: LLMSession, api: str, index: int) -> tuple[float, float]:
    """(wall, CPU of this thread) of one direct call, in seconds."""
    began, cpu = time.perf_counter(), time.thread_time()
    await direct.generate(PROMPTS[api][index], dict(SAMPLING))
    return time.perf_counter() - began, time.thread_time() - cpu


async def instant_path(tmp: Path, calls: int, tokenizer: Any, client: Client, api: str = "chat") -> list[float]:
    """Client -> proxy -> an instant backend -> client, per call (ms): the floor of the path."""
    _, round_trips = await conversation(InstantBackend(tokenizer), tmp, calls, client, api=api)
    return round_trips


async def overhead(paths: SpoolPaths, tmp: Path, calls: int, client: Client,
                   cpu_added: list[float], api: str = "chat", events: bool = True) -> tuple[list[float], list[float]]:
    router = router_for(paths, "bench-overhead")
    if api not in PROMPTS:
        async with LLMSession(router, job_id="warm-up") as llm:
            first, _ = await conversation(llm, tmp, calls, api=api)
        PROMPTS[api] = {i: c["input_ids"] for i, c in enumerate(first.calls)}
    log = EventLog(paths, "bench") if events else None
    try:
        async with LLMSession(router, job_id="proxied") as llm, LLMSession(router, job_id="direct") as direct:
            recorder, added = await conversation(llm, tmp, calls, client, direct, cpu_added, api, log)
    finally:
        if log is not None:
            log.close()
    assert [c["input_ids"] for c in recorder.calls] == [PROMPTS[api][i] for i in range(calls)], "same prompts as the warm-up"
    return added, [c["proxy_ms"] for c in recorder.calls]


async def harness_runs(paths: SpoolPaths, tmp: Path, problems: int) -> list[dict[str, Any]]:
    """Bundled math problems through the toy harness, as is and with a dropped exchange."""
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
            runs.append({"harness": "toy, drops its first exchange" if drop else "toy, keeps its history",
                         "calls": recorder.calls})
    return runs


async def cli_runs(paths: SpoolPaths, tmp: Path, image: Path, problems: int) -> list[dict[str, Any]]:
    """Bundled math problems through Claude Code and Codex CLI (the harness image's, on this host)."""
    router = router_for(paths, "bench-clis")
    runs = []
    for cli in CLIS:
        for index, (problem, *_rest) in enumerate(PROBLEMS[:problems]):
            async with LLMSession(router, job_id=f"cli-{cli}-{index}") as llm:
                recorder = CallRecorder(llm, await llm.tokenizer(), get_parser("hermes"), dict(SAMPLING),
                                        ProxyLimits(200, CLI_SETTINGS.max_context_tokens, 256))
                directory = new_proxy_dir(tmp / "px")
                async with JobProxy(recorder, directory):
                    run = prepare(cli, image, tmp / f"home-{cli}-{index}", cli_task(cli, problem), directory, CLI_SETTINGS)
                    process = await asyncio.create_subprocess_exec(*run.argv, env=run.env, cwd=run.cwd,
                                                                   stdout=asyncio.subprocess.PIPE,
                                                                   stderr=asyncio.subprocess.STDOUT)
                    out, _ = await process.communicate()
                    if process.returncode != 0:
                        raise RuntimeError(f"{cli} failed on {problem!r}: {out.decode()[-800:]}")
            runs.append({"harness": cli, "calls": recorder.calls})
    return runs


# --quick: the smoke test's size (tests/test_benchmarks.py)
# Its smoke test also checks every figure by name (per API, per harness), with the harness image.
SMOKE_TESTED_IN = "tests/proxy/test_benchmark_smoke.py"
QUICK = {"calls": 8, "rounds": 1, "clients": "process", "problems": 2}


def configuration(args: argparse.Namespace, kinds: list[Client]) -> tuple[str, bool]:
    """What this run measured, in words, and whether it is the realistic default (a harness job's)."""
    away = [f"--clients {','.join(k.value for k in kinds)}" if kinds != [Client.PROCESS] else "",
            "--no-merge (merge_ratio runs skipped)" if args.no_merge else "",
            "--no-clis (Claude Code and Codex runs skipped)" if args.no_clis and not args.no_merge else "",
            "--no-events (no llm_call event per call)" if args.no_events else ""]
    away = [a for a in away if a]
    if not away:
        return "realistic: process client, llm_call events, prefix-merged chains, merge_ratio runs", True
    return "not the default: " + "; ".join(away), False


def measure(args: argparse.Namespace, kinds: list[Client], paths: SpoolPaths, tmp: Path) -> dict[str, Any]:
    """The overhead rounds, interleaved by client kind and API; then the merge runs."""
    figures: dict[str, Any] = {"added": {k: [] for k in kinds}, "inside": {k: [] for k in kinds},
                               "instant": {k: [] for k in kinds}, "cpu": {k: [] for k in kinds},
                               "by_api": {api: {"added": [], "inside": [], "instant": [], "cpu": []} for api in APIS[1:]},
                               "loads": [os.getloadavg()[0]], "runs": []}
    tokenizer = load_tokenizer(str(tiny_model_dir()))
    events = not args.no_events
    for _ in range(args.rounds):
        for kind in kinds:
            more_added, more_inside = asyncio.run(overhead(paths, tmp, args.calls, kind, figures["cpu"][kind],
                                                           events=events))
            figures["added"][kind] += more_added
            figures["inside"][kind] += more_inside
            figures["instant"][kind] += asyncio.run(instant_path(tmp, args.calls, tokenizer, kind))
        for api, figures_of in figures["by_api"].items():   # the other APIs: the process client
            more_added, more_inside = asyncio.run(overhead(paths, tmp, args.calls, Client.PROCESS,
                                                           figures_of["cpu"], api, events))
            figures_of["added"] += more_added
            figures_of["inside"] += more_inside
            figures_of["instant"] += asyncio.run(instant_path(tmp, args.calls, tokenizer, Client.PROCESS, api))
        figures["loads"].append(os.getloadavg()[0])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description="The recording proxy: overhead per call and merge ratio.")
    parser.add_argument("--calls", type=int, default=40, help="calls of each overhead conversation")
    parser.add_argument("--rounds", type=int, default=3, help="conversations per client kind, interleaved")
    parser.add_argument("--clients", default=Client.PROCESS.value,
                        help=f"client kinds to measure (chat completions), comma-separated: "
                             f"{', '.join(c.value for c in Client)} (default: process, as a harness is)")
    parser.add_argument("--problems", type=int, default=len(PROBLEMS), help="bundled math problems per harness (merge)")
    parser.add_argument("--no-merge", action="store_true", help="skip the merge_ratio runs (not the default)")
    parser.add_argument("--no-clis", action="store_true", help="merge_ratio of the toy harness only (no harness image)")
    parser.add_argument("--no-events", action="store_true", help="no llm_call event per call (not the default)")
    args = parse_args(parser, QUICK)
    kinds = [Client(k) for k in args.clients.split(",")]
    image = None
    if not (args.no_merge or args.no_clis):
        from hpc_rollout.handlers.bundled.image import harness_image

        image = harness_image()   # built once into the cache when missing (~1.5 min after the task image)
    tmp = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    script_file = tmp / "scripts.jsonl"
    script_file.write_text("".join(json.dumps(s) + "\n" for s in scripts(args.calls)))
    server = start_server(tiny=True, extra_args=["--scripted", str(script_file), "--max-model-len", "65536"])
    try:
        paths, _ = init_run(tmp / "run")
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=0)
        measured = measure(args, kinds, paths, tmp)
        if not args.no_merge:
            measured["runs"] = asyncio.run(harness_runs(paths, tmp, args.problems))
        if image is not None:
            measured["runs"] += asyncio.run(cli_runs(paths, tmp, image, args.problems))
            measured["loads"].append(os.getloadavg()[0])
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    emit_json(report(measured, kinds, *configuration(args, kinds)))


def report(measured: dict[str, Any], kinds: list[Client], mode: str, realistic: bool) -> dict[str, Any]:
    """The table, the configuration line and the JSON figures."""
    load = sum(measured["loads"]) / len(measured["loads"])
    added, inside, instant, cpu = (measured[k] for k in ("added", "inside", "instant", "cpu"))
    rows = (("added", "added by the proxy"), ("instant", "round trip, instant backend"),
            ("inside", "inside the proxy (render + parse)"), ("cpu", "CPU added on the worker's side"))
    table = [[f"chat, {kind.value}: {label}", median(measured[key][kind]), percentile(measured[key][kind], 0.9),
              len(measured[key][kind])] for kind in kinds for key, label in rows]
    for api, figures_of in measured["by_api"].items():
        table += [[f"{api}, process: {label}", median(figures_of[key]), percentile(figures_of[key], 0.9),
                   len(figures_of[key])] for key, label in rows]
    print_table("proxy overhead per call (ms): proxied minus direct, same prompt ids",
                ["figure", "median", "p90", "calls"], table)
    print(f"  configuration: {mode}")
    print(f"  (load average {load:.1f} on {os.cpu_count()} cores: on a busy machine waits for a core dominate)")
    headline = Client.PROCESS if Client.PROCESS in kinds else kinds[0]
    figures: dict[str, Any] = {
        "proxy_overhead_median_ms": round(median(added[headline]), 3),
        "proxy_overhead_p90_ms": round(percentile(added[headline], 0.9), 3),
        "proxy_inside_median_ms": round(median(inside[headline]), 3),
        "proxy_cpu_added_median_ms": round(median(cpu[headline]), 3),
        "instant_round_trip_median_ms": round(median(instant[headline]), 3),
        "instant_round_trip_p10_ms": round(percentile(instant[headline], 0.1), 3),
        "headline_client": headline.value, "load_average": round(load, 2), "target_overhead_ms": 2.0,
        "target_overhead_ms_new_apis": 2.0, "target_cpu_added_ms": 2.0,
        "configuration": mode, "realistic_configuration": realistic}
    for kind in kinds:
        if kind is not headline:
            figures[f"proxy_overhead_{kind.value}_median_ms"] = round(median(added[kind]), 3)
            figures[f"instant_round_trip_{kind.value}_median_ms"] = round(median(instant[kind]), 3)
    for api, figures_of in measured["by_api"].items():
        figures[f"proxy_overhead_median_ms_{api}"] = round(median(figures_of["added"]), 3)
        figures[f"proxy_overhead_p90_ms_{api}"] = round(percentile(figures_of["added"], 0.9), 3)
        figures[f"proxy_inside_median_ms_{api}"] = round(median(figures_of["inside"]), 3)
        figures[f"proxy_cpu_added_median_ms_{api}"] = round(median(figures_of["cpu"]), 3)
        figures[f"instant_round_trip_median_ms_{api}"] = round(median(figures_of["instant"]), 3)
    if measured["runs"]:
        figures.update(merge_table(measured["runs"]))
    return figures


def merge_table(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Sequences trained on per harness: per_request (one per call) and prefix_merging."""
    rows = []
    figures: dict[str, Any] = {}
    toy = {Builder.PER_REQUEST: 0, Builder.PREFIX_MERGING: 0}
    for harness in dict.fromkeys(r["harness"] for r in runs):
        chosen = [r for r in runs if r["harness"] == harness]
        counts = {b: sum(len(build_samples(r["calls"], b)) for r in chosen) for b in toy}
        rows.append([harness, len(chosen), counts[Builder.PER_REQUEST], counts[Builder.PREFIX_MERGING],
                     counts[Builder.PREFIX_MERGING] / counts[Builder.PER_REQUEST]])
        if harness.startswith("toy"):
            for builder, count in counts.items():
                toy[builder] += count
        else:
            figures[f"merge_ratio_{harness.replace('-', '_')}"] = round(
                counts[Builder.PREFIX_MERGING] / counts[Builder.PER_REQUEST], 4)
            figures[f"calls_per_run_{harness.replace('-', '_')}"] = round(counts[Builder.PER_REQUEST] / len(chosen), 2)
    merge_ratio = toy[Builder.PREFIX_MERGING] / toy[Builder.PER_REQUEST]
    rows.append(["toy, all", sum(r["harness"].startswith("toy") for r in runs), toy[Builder.PER_REQUEST],
                 toy[Builder.PREFIX_MERGING], merge_ratio])
    print_table("sequences to train on, bundled math problems through each harness",
                ["harness", "runs", "per_request", "prefix_merging", "ratio"], rows)
    figures.update({"merge_ratio": round(merge_ratio, 4), "calls_per_request": toy[Builder.PER_REQUEST],
                    "sequences_prefix_merging": toy[Builder.PREFIX_MERGING]})
    return figures


if __name__ == "__main__":
    main()
