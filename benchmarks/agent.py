"""The agent loop's own costs: per-turn overhead, one bash action end to end, graders.

    python -m benchmarks.agent [--quick]

  loop_overhead_median_ms   one turn of run_agent with an instant LLM and instant tools (the
                            real tokenizer, parser, conversation buffer and template): parse +
                            dispatch + observation render, LLM and tool time excluded; the median
                            over episodes of each 20-turn episode's time per turn (so the first
                            turns' one-time template checks are spread over it; target <= 0.2 ms)
  loop_overhead_steady_median_ms
                            the median of single turns after the first two (no one-time work)
  action_median_ms          a `true` bash call through the whole path: model text -> parser ->
                            sandbox toolbox (bubblewrap, persistent pty bash) -> observation ids
  action_tmux_median_ms     the same with the bash behind tmux send-keys + capture-pane polling
                            (the reference design's mechanism; a host tmux, like benchmarks.sandbox)
  action_speedup            tmux / ours
  action_STEP_median_ms     the action's steps: parse, execute (toolbox: exec socket + bash),
                            render (observation ids); measured apart in the same loop:
                            exec_roundtrip (a ping through the exec socket) and sandbox_bash
                            (sandbox.bash("true"): socket + bash, no toolbox around it)
  math_eval_median_ms       MathHandler.eval (math-verify in its bounded child process), warm
  code_eval_overhead_ms     per hidden test: EVAL wall time (fresh sandbox, upload, runner, close)
                            minus the time the tests' own processes ran, divided by the tests
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, median, percentile, print_table
from orchestrator.agent.calls import ToolCall
from orchestrator.agent.tool_handler import RENDER_WINDOW
from orchestrator.agent.loop import AgentLimits, AgentRun, TextReply, run_agent
from orchestrator.agent.messages import tool_message
from orchestrator.agent.parsers import get_parser
from orchestrator.agent.toolbox import SandboxToolbox, ToolOutcome
from orchestrator.agent.tools import openai_tools, tool_specs
from orchestrator.llm.conversation import Conversation
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.tokenizer import load_tokenizer

BASH_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "true"}}\n</tool_call>'


@dataclass
class InstantTurn:
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"

    def to_json(self) -> dict[str, Any]:
        return {"output_ids": self.output_ids, "policy_version": 0}


class InstantLLM:
    """Answers every turn with the same tool call, at once (LLM time excluded); notes when each
    turn was asked for (`asked`: perf_counter), so turns can be timed one by one."""

    def __init__(self, tokenizer: Any, text: str) -> None:
        self.ids = list(tokenizer.encode(text, add_special_tokens=False)) + [tokenizer.eos_token_id]
        self.asked: list[float] = []

    async def generate(self, prompt_ids: list[int], sampling: dict[str, Any] | None = None) -> InstantTurn:
        self.asked.append(time.perf_counter())
        return InstantTurn(self.ids, [0.0] * len(self.ids))


class InstantTools:
    """Every call succeeds at once with a short output (tool time excluded)."""

    names = ["bash", "finish"]

    def problems(self, call: ToolCall) -> list[str]:
        return []

    async def execute(self, call: ToolCall, timeout: float) -> ToolOutcome:
        return ToolOutcome("ok\n[exit code 0]", exit_code=0, output_chars=14)


# Turns from this one on are "steady": the first two carry the conversation's one-time checks
# (orchestrator/llm/conversation.py renders them in full too; the observation pieces are made).
STEADY_FROM = 2


async def loop_overhead(tokenizer: Any, episodes: int, turns: int,
                        steady: list[float] | None = None) -> list[float]:
    """Per episode, run_agent's time per turn (the episode's first prompt is rendered before the
    clock starts, as a worker's INIT does); `steady` gets each later turn's own time."""
    per_turn = []
    specs = tool_specs(["bash", "finish"])
    for _ in range(episodes):
        conversation = Conversation(tokenizer, [{"role": "user", "content": "Run true."}], tools=openai_tools(specs),
                                    window=RENDER_WINDOW)
        run = AgentRun(conversation)
        limits = AgentLimits(max_turns=turns, max_context_tokens=1_000_000, text_reply=TextReply.NUDGE)
        llm = InstantLLM(tokenizer, BASH_CALL)   # the stub's own set-up is not the loop's
        started = time.perf_counter()
        await run_agent(llm, run, InstantTools(), parse=get_parser("hermes"), limits=limits)
        per_turn.append((time.perf_counter() - started) * 1000 / len(run.turns))
        if steady is not None:
            steady += [(later - earlier) * 1000 for earlier, later in zip(llm.asked[STEADY_FROM:], llm.asked[STEADY_FROM + 1:])]
    return per_turn


class TmuxBash:
    """bash behind tmux: send-keys, then poll capture-pane for the end marker."""

    def __init__(self) -> None:
        self.server = f"hr-agent-bench-{os.getpid()}"
        self.base = ["tmux", "-L", self.server, "-f", "/dev/null"]
        subprocess.run(self.base + ["new-session", "-d", "-s", "a", "-x", "200", "-y", "50",
                                    "env -i PATH=/usr/bin:/bin TERM=dumb bash --norc --noprofile"], check=True)
        self.count = 0

    def run(self, command: str) -> str:
        self.count += 1
        marker = f"__done_{self.count}__"
        subprocess.run(self.base + ["send-keys", "-t", "a", f"{command}; echo {marker} $?", "Enter"], check=True)
        while True:
            pane = subprocess.run(self.base + ["capture-pane", "-p", "-t", "a"], capture_output=True, text=True).stdout
            if pane.count(marker) >= 2:
                break
        if self.count % 20 == 0:
            subprocess.run(self.base + ["send-keys", "-t", "a", "clear", "Enter"], check=True)
            subprocess.run(self.base + ["clear-history", "-t", "a"], check=True)
        return pane

    def close(self) -> None:
        subprocess.run(self.base + ["kill-server"], capture_output=True)


# Per action: parse the reply, toolbox.execute (exec socket + bash + the toolbox around it),
# render the observation ids; then, measured apart, the exec socket's round trip alone (ping)
# and sandbox.bash("true") (socket + bash, no toolbox).
STEPS = ("parse", "execute", "render", "exec_roundtrip", "sandbox_bash")


async def actions(tokenizer: Any, rounds: int, spool: Any) -> tuple[list[float], list[float], dict[str, list[float]]]:
    from orchestrator.sandbox.start import start_sandbox

    parse = get_parser("hermes")
    specs = tool_specs(["bash", "finish"])
    conversation = Conversation(tokenizer, [{"role": "user", "content": "Run true."}], tools=openai_tools(specs),
                                window=RENDER_WINDOW)
    sampled = list(tokenizer.encode(BASH_CALL, add_special_tokens=False)) + [tokenizer.eos_token_id]
    conversation.add_assistant(sampled, [0.0] * len(sampled), "stop")
    reply = tokenizer.decode(sampled[:-1], skip_special_tokens=False)

    def observation_ids(call: ToolCall, text: str) -> list[int]:
        return conversation.render_new([tool_message(call, text)])

    sandbox = await start_sandbox("bwrap", job_id="bench-agent", paths=spool)
    ours = []
    steps: dict[str, list[float]] = {name: [] for name in STEPS}
    try:
        toolbox = SandboxToolbox(sandbox, specs)
        for index in range(rounds + 20):
            started = time.perf_counter()
            call = parse(reply).calls[0]
            parsed = time.perf_counter()
            outcome = await toolbox.execute(call, 30)
            executed = time.perf_counter()
            observation_ids(call, outcome.observation)
            rendered = time.perf_counter()
            # The parts of `execute` on their own, interleaved: the exec socket's round trip
            # (a ping), and bash `true` through the sandbox API without the toolbox around it.
            await sandbox.call("ping", {})
            pinged = time.perf_counter()
            await sandbox.bash("true", timeout=30, max_output=toolbox.max_output_chars)
            bashed = time.perf_counter()
            if index >= 20:
                ours.append((rendered - started) * 1000)
                for name, seconds in zip(STEPS, (parsed - started, executed - parsed, rendered - executed,
                                                pinged - rendered, bashed - pinged)):
                    steps[name].append(seconds * 1000)
            assert outcome.exit_code == 0, outcome
    finally:
        await sandbox.close()
    tmux_samples = []
    if shutil.which("tmux"):
        tmux = TmuxBash()
        try:
            for index in range(min(rounds, 200) + 5):
                started = time.perf_counter()
                call = parse(reply).calls[0]
                pane = tmux.run(call.arguments["command"])
                observation_ids(call, pane[-200:])
                if index >= 5:
                    tmux_samples.append((time.perf_counter() - started) * 1000)
        finally:
            tmux.close()
    return ours, tmux_samples, steps


def context(spool: Any, handler: str) -> Any:
    from orchestrator.handler_api.context import JobContext, WorkerServices
    from orchestrator.spool.jobs import JobSpec, Stage
    from orchestrator.spool.paths import current_node

    services = WorkerServices(paths=spool, worker_id="bench", node=current_node(), runtime="bwrap",
                              sandbox_defaults={"image": os.environ.get("HPC_ROLLOUT_TASK_IMAGE", "")} if
                              os.environ.get("HPC_ROLLOUT_TASK_IMAGE") else {})

    def make(instance: dict[str, Any], index: int) -> Any:
        job = JobSpec(job_id=f"bench-{handler}-{index:04d}", group_id="g", instance_id=str(index), sample_index=0,
                      handler=handler, instance=instance)
        return JobContext(job=job, stage=Stage.EVAL, attempt=1, services=services)
    return make


async def graders(spool: Any, rounds: int) -> tuple[list[float], list[float], int]:
    from hpc_rollout.handlers.bundled import code_problems, math_problems
    from hpc_rollout.handlers.code_task import CodeHandler
    from hpc_rollout.handlers.math_task import MathHandler

    math_handler, make = MathHandler(), context(spool, "math")
    problems = math_problems.PROBLEMS
    await math_handler.eval(make({"problem": "1+1", "answer": "2"}, 0), {"answer": "2"})   # start the child
    math_ms = []
    for index in range(rounds):
        problem, answer, _, _ = problems[index % len(problems)]
        started = time.perf_counter()
        scored = await math_handler.eval(make({"problem": problem, "answer": answer}, index), {"answer": answer})
        math_ms.append((time.perf_counter() - started) * 1000)
        assert scored["reward"] == 1.0, (problem, scored)
    code_handler, make = CodeHandler(), context(spool, "code")
    overhead, tests = [], 0
    for index, problem in enumerate(code_problems.PROBLEMS):
        instance = {k: v for k, v in problem.items() if k != "name"}
        started = time.perf_counter()
        scored = await code_handler.eval(make(instance, index), {"solution": problem["solution"]})
        total = (time.perf_counter() - started) * 1000
        assert scored["reward"] == 1.0, (problem["name"], scored)
        overhead.append((total - sum(scored["test_ms"])) / len(scored["test_ms"]))
        tests += len(scored["test_ms"])
    return math_ms, overhead, tests


async def main(quick: bool) -> dict[str, Any]:
    from orchestrator.spool.paths import SpoolPaths

    tokenizer = load_tokenizer(tiny_model_dir())
    scratch = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    os.environ.setdefault("HPC_ROLLOUT_RUNTIME_DIR", str(scratch / "rt"))
    spool = SpoolPaths.of(scratch / "spool")
    try:
        steady: list[float] = []
        overhead = await loop_overhead(tokenizer, 5 if quick else 20, 20, steady)
        ours, tmux, steps = await actions(tokenizer, 50 if quick else 300, spool)
        math_ms, code_overhead, tests = await graders(spool, 20 if quick else 100)
    finally:
        from orchestrator.grading.math_answers import shared_verifier

        shared_verifier().close()
        shutil.rmtree(scratch, ignore_errors=True)
    figures = {
        "loop_overhead_median_ms": round(median(overhead), 3),
        "loop_overhead_steady_median_ms": round(median(steady), 3),
        "action_median_ms": round(median(ours), 3),
        "action_p99_ms": round(percentile(ours, 0.99), 3),
        "action_tmux_median_ms": round(median(tmux), 3) if tmux else None,
        "action_speedup": round(median(tmux) / median(ours), 1) if tmux else None,
        "math_eval_median_ms": round(median(math_ms), 3),
        "code_eval_overhead_ms": round(median(code_overhead), 3),
        **{f"action_{name}_median_ms": round(median(samples), 3) for name, samples in steps.items()},
    }
    print_table("agent loop (python -m benchmarks.agent)", ["measure", "result", "target"], [
        ("loop overhead per turn, median of episodes", f"{figures['loop_overhead_median_ms']} ms", "<= 0.2 ms"),
        (f"  a turn after the first {STEADY_FROM} (one-time checks done), median",
         f"{figures['loop_overhead_steady_median_ms']} ms", ""),
        ("bash `true` action end to end, median / p99", f"{figures['action_median_ms']} / {figures['action_p99_ms']} ms", ""),
        ("  parse / execute / render, median", " / ".join(f"{figures[f'action_{n}_median_ms']}" for n in STEPS[:3]) + " ms", ""),
        ("  exec socket round trip / sandbox bash, median", " / ".join(f"{figures[f'action_{n}_median_ms']}" for n in STEPS[3:]) + " ms", ""),
        ("same through tmux, median", f"{figures['action_tmux_median_ms']} ms", ""),
        ("speed-up over tmux", f"{figures['action_speedup']}x", ">= 25x"),
        ("math EVAL (math-verify), median", f"{figures['math_eval_median_ms']} ms", "<= 50 ms"),
        ("code EVAL overhead per hidden test, median", f"{figures['code_eval_overhead_ms']} ms", "<= 100 ms"),
    ])
    print(f"({len(overhead)} episodes x 20 turns, {len(ours)} actions, {len(tmux)} tmux actions, "
          f"{len(math_ms)} math checks, {tests} code tests; {os.cpu_count()} cores)")
    return figures


# what tests/test_benchmarks.py checks for before running it (--quick: fewer rounds)
REQUIRES = ("bwrap", "tmux")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    emit_json(asyncio.run(main(parser.parse_args().quick)))
