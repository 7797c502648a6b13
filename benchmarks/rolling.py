"""Rolling weight updates: tokens/s while the backends reload, rolling against all at once.

    python -m benchmarks.rolling [--quick] [--backends 4] [--sessions 16] [--reload-delay-s 4]
                                 [--steady-s 4] [--turns 4] [--max-tokens 16] [--lag 1]

--backends `serve-llm --tiny` servers (real weight reloads, as benchmarks.reload), each holding
generation for --reload-delay-s once its running batch has drained (`serve-llm
--reload-delay-s`: the load time of a large checkpoint; the tiny model's own is ~0.03 s). Steady
load: --sessions conversations at all times, each a task of --turns turns of --max-tokens tokens
through the project's real client path (LLMSession on a Router: least in flight, sticky, a task
leaves a draining backend at its next turn); a finished task is followed by a new one at once.

Both modes run in one invocation on the same servers, one after the other, each in a fresh run
directory with its backends at version 0 and max_policy_lag --lag:
    all-at-once   spool.swap_weights(ckpt, 1): every backend reloads together
    rolling       spool.swap_weights(ckpt, 1, rolling=True): waves keeping half of them serving
For each: tokens/s over --steady-s before the swap (steady state), tokens/s between the swap's
call and its return (completions counted when they finish), their ratio (goal: rolling >= 0.7,
all-at-once falls to ~0), the slowest 0.5 s during the swap, and per sample (turn) its policy
lag: the registry's version when the turn finished minus the version it was sampled with.

The servers are pinned in pairs to the CPUs (--backends / CPUs per CPU, in registry order), so a
backend that idles while reloading lends no compute to the ones serving: the first wave (the
first half) shares its CPUs with no serving backend, as separate GPUs would. What the serving
backends gain is only what continuous batching gives them at a larger batch.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import emit_json, parse_args, print_table
from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.history import read_history
from orchestrator.llm.registry import BackendRegistry
from orchestrator.llm.router import Router
from orchestrator.llm.session import LLMSession
from orchestrator.spool.staleness import StalePolicy
from orchestrator.trainer.api import Spool

MODES = ("all-at-once", "rolling")
GOAL = 0.7
BIN_S = 0.5
WORKER = "bench-rolling"


@dataclass
class Sample:
    finished: float
    sent: float
    tokens: int
    backend: str
    version: int
    lag: int


@dataclass
class Load:
    """--sessions tasks of --turns turns in flight at all times, on one event loop in a thread."""

    spool: Spool
    sessions: int
    turns: int
    max_tokens: int
    samples: list[Sample] = field(default_factory=list)
    stale: int = 0
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        router = Router(self.spool.paths, WORKER)
        try:
            await asyncio.gather(*(self._conversations(router, n) for n in range(self.sessions)))
        finally:
            await router.close()

    async def _conversations(self, router: Router, lane: int) -> None:
        task = 0
        while not self.stop.is_set():
            task += 1
            prompt = [1, 30 + lane % 50, 31 + task % 50, 32]
            async with LLMSession(router, job_id=f"{lane}-{task}") as session:
                for _ in range(self.turns):
                    if self.stop.is_set():
                        return
                    try:
                        turn = await session.generate(prompt, {"max_tokens": self.max_tokens, "temperature": 1.0,
                                                               "ignore_eos": True})
                    except StalePolicy:
                        self.stale += 1
                        break
                    except Exception as exc:   # counted and shown: a benchmark that hides failures lies
                        self.failed.append(f"{type(exc).__name__}: {exc}")
                        await asyncio.sleep(0.1)
                        break
                    now = time.time()
                    current = router.registry.read().policy_version
                    self.samples.append(Sample(now, turn.sent_at, len(turn.output_ids), turn.backend,
                                               turn.policy_version, current - turn.policy_version))
                    prompt = prompt + turn.output_ids + [33]

    def __enter__(self) -> "Load":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(120)

    def tokens_per_s(self, start: float, end: float) -> float:
        return sum(s.tokens for s in self.samples if start <= s.finished < end) / max(end - start, 1e-9)

    def slowest_bin(self, start: float, end: float) -> float:
        bins = max(1, int((end - start) // BIN_S))
        return min(self.tokens_per_s(start + i * BIN_S, start + (i + 1) * BIN_S) for i in range(bins))


def turns_to_draining(spool: Spool, samples: list[Sample]) -> int:
    """Turns sent to a backend while the registry had it draining (history.jsonl): 0 expected."""
    history, _ = read_history(spool.paths.backends_history)
    spans: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for line in history:
        if line.get("change") != "state":
            continue
        if line["state"] == "draining":
            since[line["url"]] = line["t"]
        elif line.get("from_state") == "draining" and line["url"] in since:
            spans.setdefault(line["url"], []).append((since.pop(line["url"]), line["t"]))
    return sum(1 for s in samples for a, b in spans.get(s.backend, []) if a < s.sent < b)


def run_mode(mode: str, base: Path, servers: list[LocalServer], checkpoint: Path, args: argparse.Namespace) -> dict:
    spool = Spool.create(base / mode, **{"trainer.max_policy_lag": args.lag})
    heartbeat = spool.paths.heartbeat(WORKER)   # the load's router counts its tasks as a live worker's
    heartbeat.parent.mkdir(parents=True, exist_ok=True)
    heartbeat.write_text("{}")
    for server in servers:
        BackendRegistry(spool.paths).add(server.url, version=0)
    with Load(spool, args.sessions, args.turns, args.max_tokens) as load:
        time.sleep(args.warm_s)
        steady_start = time.time()
        time.sleep(args.steady_s)
        asked = time.time()
        report = spool.swap_weights(checkpoint, version=1, max_policy_lag=args.lag, rolling=mode == "rolling")
        confirmed = time.time()
        time.sleep(args.after_s)
    steady = load.tokens_per_s(steady_start, asked)
    during = load.tokens_per_s(asked, confirmed)
    lags = Counter(s.lag for s in load.samples)
    return {
        "mode": mode, "steady": steady, "during": during, "ratio": during / steady if steady else 0.0,
        "slowest_bin": load.slowest_bin(asked, confirmed), "swap_s": confirmed - asked,
        "waves": len(report.waves) or 1, "samples": len(load.samples), "lags": lags,
        "max_lag": max(lags) if lags else 0, "stale": load.stale, "failed": load.failed,
        "to_draining": turns_to_draining(spool, load.samples),
    }


def warm_up(base: Path, servers: list[LocalServer], args: argparse.Namespace) -> None:
    """The load once before the modes: the servers' first batches (torch's warm-up) and the client's
    first requests would otherwise count in the first mode's steady state only."""
    spool = Spool.create(base / "warm-up")
    for server in servers:
        BackendRegistry(spool.paths).add(server.url, version=0)
    with Load(spool, args.sessions, args.turns, args.max_tokens):
        time.sleep(args.warm_s)


def start_servers(count: int, delay_s: float, max_batch: int) -> list[LocalServer]:
    """`count` servers started together (their start-up overlaps), pinned in pairs to the CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    per_cpu = max(1, -(-count // len(cpus)))
    args = ["--reload-delay-s", str(delay_s), "--max-batch", str(max_batch)]
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(start_server, tiny=True, threads=1, extra_args=args,
                               cpus={cpus[min(i // per_cpu, len(cpus) - 1)]}) for i in range(count)]
        started, problems = [], []
        for future in futures:
            try:
                started.append(future.result())
            except Exception as exc:
                problems.append(exc)
    if problems:
        for server in started:
            server.stop()
        raise problems[0]
    return started


# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"backends": 2, "sessions": 4, "reload_delay_s": 1.0, "warm_s": 0.5, "steady_s": 1.5, "after_s": 0.2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=16, help="conversations in flight at all times")
    parser.add_argument("--turns", type=int, default=4, help="turns per task")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per turn")
    parser.add_argument("--max-batch", type=int, default=16, help="serve-llm --max-batch")
    parser.add_argument("--reload-delay-s", type=float, default=4.0, help="a reload's load time (serve-llm)")
    parser.add_argument("--warm-s", type=float, default=2.0)
    parser.add_argument("--steady-s", type=float, default=4.0, help="the steady state measured before a swap")
    parser.add_argument("--after-s", type=float, default=1.0)
    parser.add_argument("--lag", type=int, default=1, help="max_policy_lag")
    args = parse_args(parser, QUICK)
    base = Path(tempfile.mkdtemp(prefix="bench-rolling-"))
    servers = start_servers(args.backends, args.reload_delay_s, args.max_batch)
    try:
        warm_up(base, servers, args)
        # the served weights again: a real reload (read, drain, load) at the cost of any checkpoint of this shape
        results = [run_mode(mode, base, servers, tiny_model_dir(), args) for mode in MODES]
    finally:
        with ThreadPoolExecutor(len(servers) or 1) as pool:
            list(pool.map(lambda server: server.stop(), servers))
        shutil.rmtree(base, ignore_errors=True)
    by = {r["mode"]: r for r in results}
    print_table(f"{args.backends} backends, {args.sessions} conversations, reload {args.reload_delay_s:g} s each, "
                f"max_policy_lag {args.lag}",
                ["mode", "steady tok/s", "during swap tok/s", "ratio", "slowest 0.5 s", "swap s", "waves",
                 "turns to draining", "failed"],
                [[r["mode"], r["steady"], r["during"], r["ratio"], r["slowest_bin"], r["swap_s"], r["waves"],
                  r["to_draining"], len(r["failed"])] for r in results])
    lags = sorted(set().union(*(r["lags"] for r in results)))
    print_table("policy lag per sample (registry version when the turn finished - version it was sampled with)",
                ["mode", *[f"lag {lag}" for lag in lags], "stale"],
                [[r["mode"], *[r["lags"].get(lag, 0) for lag in lags], r["stale"]] for r in results])
    rolling, at_once = by["rolling"], by["all-at-once"]
    met = rolling["ratio"] >= GOAL
    print(f"\ngoal: rolling keeps >= {GOAL} of steady-state tokens/s during the swap "
          f"({rolling['ratio']:.2f}: {'met' if met else 'NOT met'}); all at once falls to ~0 "
          f"({at_once['ratio']:.2f}, slowest 0.5 s {at_once['slowest_bin']:.0f} tok/s); "
          f"no sample beyond max_policy_lag {args.lag} (max seen {max(r['max_lag'] for r in results)})")
    for r in results:
        for problem in r["failed"][:3]:
            print(f"  {r['mode']}: {problem}")
    emit_json({
        "rolling_ratio": round(rolling["ratio"], 3), "all_at_once_ratio": round(at_once["ratio"], 3),
        "rolling_tok_s": round(rolling["during"], 1), "all_at_once_tok_s": round(at_once["during"], 1),
        "steady_tok_s": round((rolling["steady"] + at_once["steady"]) / 2, 1),
        "rolling_swap_s": round(rolling["swap_s"], 2), "all_at_once_swap_s": round(at_once["swap_s"], 2),
        "max_lag": max(r["max_lag"] for r in results), "turns_to_draining": sum(r["to_draining"] for r in results),
        "failed_turns": sum(len(r["failed"]) for r in results),
        "rolling_lags": {str(k): v for k, v in sorted(rolling["lags"].items())},
        "all_at_once_lags": {str(k): v for k, v in sorted(at_once["lags"].items())},
        "goal_met": met,
    })


if __name__ == "__main__":
    main()
