"""Long episodes through a real worker, real bubblewrap sandboxes (the host's /usr) and serve-llm:
context management lets a 30-turn episode finish in a context window it would overflow (drop, and
summarize with the random tiny model), every request's input ids being exactly what the backend
received; the summarize tool compacts when the model asks; process rewards per tool result land in
the row's turn_rewards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from hpc_rollout.handlers.bundled.write import tool_call
from orchestrator.agent.context import ContextPolicy
from orchestrator.agent.loop import AgentLimits, TextReply, ToolCallRecord
from orchestrator.agent.tool_handler import ToolAgentHandler
from orchestrator.agent.toolbox import ToolOutcome
from orchestrator.devserver.local_server import local_server
from orchestrator.handler_api import contract as handler_module
from orchestrator.handler_api.context import JobContext
from orchestrator.llm.registry import BackendRegistry
from orchestrator.proxy.trajectory import samples_of
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run
from orchestrator.submission.submit import submit_rows
from tests.agents.conftest import needs_bwrap
from tests.core.util import FAST, rows, serve_in_process

pytestmark = [needs_bwrap, pytest.mark.llm]

COUNT = "Print the numbers from 100 to 160, thirty times over, then finish. [count-task]"
THINK = "Think twice, then finish. [think-task]"
SUMMARY = "Print the numbers twice, summarize, then finish. [summary-task]"
PHASE_TWO = "PHASE-TWO: the numbers were printed twice and nothing else is left"
PRINT = tool_call("bash", command="seq 100 160")
WINDOW = 4096   # the 30-turn count episode needs ~11,000 tokens without context management


class Counting(ToolAgentHandler):
    """A test family: the task is its text; reward 1 when the agent finished."""

    name: ClassVar[str] = "counting"
    tools: ClassVar[tuple[str, ...]] = ("bash", "think", "finish")
    limits: ClassVar[AgentLimits] = AgentLimits(max_turns=40, max_context_tokens=WINDOW, max_tokens_per_turn=64,
                                                max_wall_s=600, tool_timeout_s=30, text_reply=TextReply.NUDGE)
    context: ClassVar[ContextPolicy] = ContextPolicy()

    def task(self, instance: dict[str, Any]) -> str:
        return str(instance["prompt"])

    def messages(self, task: str) -> list[dict[str, Any]]:
        return [{"role": "system", "content": "You run commands."}, {"role": "user", "content": task}]

    def tool_reward(self, task: str, record: ToolCallRecord, outcome: ToolOutcome) -> float | None:
        return 0.25 if record.name == "think" else None   # a process reward for each thought

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        return {"reward": 1.0 if result.get("stop_reason") == "finished" else 0.0}


SCRIPTS = [
    {"match": "[count-task]", "replies": [PRINT] * 30 + [tool_call("finish")]},
    {"match": "[think-task]", "replies": [tool_call("think", thought="one"), tool_call("think", thought="two"),
                                          tool_call("finish")]},
    {"match": "[summary-task]", "replies": [PRINT, PRINT, tool_call("summarize", summary=PHASE_TWO)],
     "after": tool_call("think", thought="lost: the summary did not replace the turns")},
    # After the summary (kept: the turn that called summarize), the next reply is this script's second.
    {"match": PHASE_TWO, "replies": ["unused", tool_call("finish")]},
]


@pytest.fixture
def counting() -> Iterator[None]:
    handler_module._loaded[Counting.name] = Counting
    try:
        yield
    finally:
        handler_module._loaded.pop(Counting.name, None)


def run_tasks(tmp_path: Path, url: str, tasks: list[dict[str, Any]], **sampling: Any) -> SpoolPaths:
    paths, _ = init_run(tmp_path / "run", {**FAST, "sandbox.runtime": "bwrap", "sandbox.image": ""})
    BackendRegistry.of(paths).add(url, protocol="vllm", version=0)
    report = submit_rows(paths, enumerate(tasks, 1), handler=Counting.name, sampling=sampling)
    assert not report.rejected, report.rejected
    serve_in_process(paths, timeout=600, run_pool=4)
    return paths


def served(record: Path) -> set[tuple[tuple[int, ...], tuple[int, ...]]]:
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return {(tuple(g["prompt_ids"]), tuple(g["output_ids"])) for g in lines}


def assert_inputs_are_what_the_backend_received(row: dict[str, Any], record: Path) -> None:
    sent = {(tuple(t["input_ids"]), tuple(t["output_ids"])) for t in row["turns"]}
    assert sent <= served(record)
    for sample in samples_of(row):   # each context is a well-formed sample: calls extend it verbatim
        for index in sample.calls:
            inputs = list(row["turns"][index]["input_ids"])
            assert inputs[:len(sample.prompt_ids)] == list(sample.prompt_ids)
            assert len(inputs) <= len(sample.prompt_ids) + len(sample.response_ids)


def test_a_30_turn_episode_finishes_in_a_small_window_by_dropping_old_observations(
        tmp_path: Path, counting: None) -> None:
    scripts = tmp_path / "scripts.jsonl"
    scripts.write_text("".join(json.dumps(s) + "\n" for s in SCRIPTS))
    record = tmp_path / "record.jsonl"
    args = ["--scripted", str(scripts), "--max-model-len", str(WINDOW)]
    with local_server(tiny=True, record=record, extra_args=args) as url:
        paths = run_tasks(tmp_path, url, [
            {"instance_id": "drop", "prompt": COUNT, "context": {"mode": "drop", "budget_tokens": WINDOW - 256,
                                                                 "keep_turns": 2}},
            {"instance_id": "none", "prompt": COUNT},
        ])
    found = {r["instance_id"]: r for r in rows(paths)}
    assert found["none"]["stop_reason"] == "context_full"          # the window is too small without it
    assert len(found["none"]["turns"]) < 15, len(found["none"]["turns"])
    row = found["drop"]
    assert (row["status"], row["stop_reason"], row["reward"]) == ("ok", "finished", 1.0), row["result"]
    assert len(row["turns"]) == 31 and len(row["tool_calls"]) == 31
    assert all(len(t["input_ids"]) + len(t["output_ids"]) <= WINDOW for t in row["turns"])
    assert_inputs_are_what_the_backend_received(row, record)
    result = json.loads(row["result"])
    compactions = result["context_compactions"]
    assert compactions and all(c["mode"] == "drop" and c["tokens_after"] < c["tokens_before"] for c in compactions)
    assert len(result["samples"]) == len(compactions) + 1 and sum(map(len, result["samples"])) == 31
    # The row's sequence is the last context, and the last turn sits in it at its place.
    last = row["turns"][-1]
    assert list(row["prompt_ids"]) + list(row["response_ids"]) == list(last["input_ids"]) + list(last["output_ids"])
    assert row["turn_spans"][-1] is not None and row["turn_spans"][0] is None   # the first turn: an earlier context
    assert "[output dropped to save context" in _decoded(last["input_ids"])


def test_summarize_keeps_a_random_model_going_for_30_turns(tmp_path: Path, counting: None) -> None:
    record = tmp_path / "record.jsonl"
    context = {"mode": "summarize", "keep_turns": 2, "summary_tokens": 24}   # compacts past 800 - 24 - 128
    with local_server(tiny=True, record=record) as url:
        paths = run_tasks(tmp_path, url, [{"prompt": "Say anything.", "agent": {"max_turns": 30, "max_context_tokens": 800},
                                           "context": context}], max_tokens=24, temperature=1.0)
    [row] = rows(paths)
    assert row["status"] == "ok" and row["stop_reason"] == "max_turns", (row["stop_reason"], row["error"])
    compactions = json.loads(row["result"])["context_compactions"]
    assert compactions and {c["mode"] for c in compactions} == {"summarize"}
    summaries = sum(1 for t in row["turns"] if t["input_ids"] and "nearly full" in _decoded(t["input_ids"]))
    assert summaries == len(compactions)                  # one summary request (a turn of its own) per compaction
    assert len(row["turns"]) == 30 + summaries
    assert all(len(t["input_ids"]) + len(t["output_ids"]) <= 800 for t in row["turns"])
    assert_inputs_are_what_the_backend_received(row, record)
    received = [json.loads(line) for line in record.read_text().splitlines()]   # the only job: in order
    assert [(list(t["input_ids"]), list(t["output_ids"])) for t in row["turns"]] == \
        [(g["prompt_ids"], g["output_ids"]) for g in received]


def test_the_summarize_tool_replaces_earlier_turns_and_tool_rewards_reach_the_row(
        tmp_path: Path, counting: None) -> None:
    scripts = tmp_path / "scripts.jsonl"
    scripts.write_text("".join(json.dumps(s) + "\n" for s in SCRIPTS))
    record = tmp_path / "record.jsonl"
    with local_server(tiny=True, record=record, extra_args=["--scripted", str(scripts)]) as url:
        paths = run_tasks(tmp_path, url, [
            {"instance_id": "summary", "prompt": SUMMARY, "context": {"summarize_tool": True, "keep_turns": 1}},
            {"instance_id": "think", "prompt": THINK},
        ])
    found = {r["instance_id"]: r for r in rows(paths)}
    row = found["summary"]
    assert (row["stop_reason"], len(row["turns"])) == ("finished", 4), [t["output_ids"][:5] for t in row["turns"]]
    [compaction] = json.loads(row["result"])["context_compactions"]
    assert compaction["mode"] == "summarize" and compaction["after_turn"] == 3
    after = _decoded(row["turns"][3]["input_ids"])
    assert PHASE_TWO in after and after.count("seq 100 160") == 0   # the printing turns are gone, the summary is in
    assert_inputs_are_what_the_backend_received(row, record)

    thought = found["think"]
    assert list(thought["turn_rewards"]) == [0.25, 0.25, None]      # one per think result, on its turn
    assert [c["name"] for c in thought["tool_calls"]] == ["think", "think", "finish"]


def _decoded(ids: Any) -> str:
    from orchestrator.devserver.tiny_model import tiny_model_dir
    from orchestrator.llm.tokenizer import load_tokenizer

    return load_tokenizer(tiny_model_dir()).decode(list(ids))
