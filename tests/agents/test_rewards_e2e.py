"""The three task families end to end: real local workers, real bwrap sandboxes (the `tasks`
image), a real HTTP server (serve-llm --scripted: the real tokenizer renders each scripted reply
to ids), bundled tasks. One run holds every case, so the server and workers start once:
  * right answers -> reward 1; wrong answers, no-ops -> 0; SWE decoy patches (FAIL_TO_PASS
    fixed, a PASS_TO_PASS test broken) -> 0;
  * misbehaving agents (malformed calls, unknown tools, huge outputs, hung code, a full
    context, too many turns, the wall clock) -> a row with the right stop reason;
  * the token record: mask 1 exactly on sampled ids, observations = the template's rendering
    of the tool messages, each prompt = previous prompt + sampled + observation ids, verbatim;
  * no sandbox is left behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpc_rollout.handlers.bundled.math_problems import PROBLEMS as MATH
from hpc_rollout.handlers.bundled.swe_repos import REPOS
from hpc_rollout.handlers.bundled.write import Bundled, tool_call
from orchestrator.devserver.local_server import start_server
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.tokenizer import load_tokenizer
from tests.agents.conftest import needs_bwrap
from tests.agents.helpers import by_instance, new_run, rows, run_workers, scripts_for, select, submit
from tests.sandbox.helpers import sandbox_processes

pytestmark = [needs_bwrap, pytest.mark.llm]

RIGHT_MATH, WRONG_MATH = [p for p, *_ in MATH[:4]], [p for p, *_ in MATH[4:7]]


def title(index: int) -> str:
    return REPOS[index].problem_statement.splitlines()[0]


# Misbehaving agents: math tasks with their own limits and scripts.
ABUSE: list[tuple[str, dict[str, Any], list[str]]] = [
    ("abuse-malformed", {}, [
        "<tool_call>{not json}</tool_call>"
        + tool_call("rm_rf", path="/") + tool_call("python", source="1")
        + "<tool_call>{\"name\": \"python\", \"arguments\": {\"code\": \"2 + 2\"}}",
        tool_call("submit", answer="4")]),
    ("abuse-huge-output", {}, [tool_call("python", code="print('x' * 3_000_000)"), tool_call("submit", answer="1")]),
    ("abuse-hung-code", {"tool_timeout_s": 1.5}, [tool_call("python", code="import time\ntime.sleep(120)"),
                                                  tool_call("submit", answer="1")]),
    ("abuse-context", {"max_context_tokens": 900}, [tool_call("python", code="print('word ' * 2000)"),
                                                    tool_call("submit", answer="1")]),
    ("abuse-turns", {"max_turns": 2}, [tool_call("think", thought="hmm")] * 5),
    ("abuse-wall-clock", {"max_wall_s": 3, "tool_timeout_s": 60},
     [tool_call("python", code="import time\ntime.sleep(1.2)")] * 10),
]
EXPECTED_STOP = {"abuse-malformed": "finished", "abuse-huge-output": "finished", "abuse-hung-code": "finished",
                 "abuse-context": "context_full", "abuse-turns": "max_turns", "abuse-wall-clock": "timeout"}


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory: pytest.TempPathFactory, task_image: Path, bundled: Bundled) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("scripted")
    code_rows = [json.loads(line) for line in bundled.code.read_text().splitlines()]
    abuse_scripts = [{"match": f"Task {name}.", "replies": replies} for name, _, replies in ABUSE]
    scripts = scripts_for({
        bundled.right: RIGHT_MATH + [r["statement"] for r in code_rows[:3]] + [title(0)],
        bundled.wrong: WRONG_MATH + [r["statement"] for r in code_rows[3:5]] + [title(1)],
        bundled.decoy: [title(2)],
    }, abuse_scripts, tmp / "scripts.jsonl")
    record = tmp / "record.jsonl"
    server = start_server(tiny=True, record=record, extra_args=["--scripted", str(scripts), "--max-model-len", "32768"])
    try:
        paths = new_run(tmp, task_image, server.url, **{"sandbox.allowed_binds": [str(bundled.mirrors)]})
        submit(paths, select(bundled.math, tmp / "math.jsonl", 7), "math", max_tokens=512)
        submit(paths, select(bundled.code, tmp / "code.jsonl", 5), "code", max_tokens=512)
        submit(paths, select(bundled.swe, tmp / "swe.jsonl"), "swe", max_tokens=512)
        abuse = tmp / "abuse.jsonl"
        abuse.write_text("".join(json.dumps({"instance_id": name, "problem": f"Task {name}.", "answer": "4",
                                             "agent": limits}) + "\n" for name, limits, _ in ABUSE))
        submit(paths, abuse, "math", max_tokens=512)
        unscripted = tmp / "unscripted.jsonl"   # no script matches: the backend refuses every turn
        unscripted.write_text(json.dumps({"instance_id": "unscripted", "problem": "Nobody wrote this.", "answer": "1"}) + "\n")
        submit(paths, unscripted, "math", max_tokens=512)
        run_workers(paths, tmp / "sandboxes")
    finally:
        server.stop()
    return {"rows": by_instance(rows(paths)), "record": record, "runtime": tmp / "sandboxes", "run_dir": str(paths.root),
            "expected_jobs": 7 + 5 + 3 + len(ABUSE) + 1}


def test_every_job_has_a_row_and_no_sandbox_is_left(scripted_run: dict[str, Any]) -> None:
    assert len(scripted_run["rows"]) == scripted_run["expected_jobs"]
    assert all(row["stop_reason"] for row in scripted_run["rows"].values())
    assert sandbox_processes(scripted_run["runtime"]) == []
    assert not any((scripted_run["runtime"] / "rt").glob("*/sb/*")), "sandbox runtime dirs left behind"


def test_right_answers_get_1_wrong_ones_and_no_ops_0(scripted_run: dict[str, Any]) -> None:
    found = scripted_run["rows"]
    right = [f"math-{i:02d}" for i in range(4)] + ["code-a-plus-b", "code-reverse", "code-vowels", "intervals-1"]
    wrong = [f"math-{i:02d}" for i in range(4, 7)] + ["code-maximum", "code-fibonacci", "roman-1", "textstats-1"]
    for instance_id in right + wrong:
        row = found[instance_id]
        assert row["status"] == "ok", (instance_id, row["error"])
        assert row["stop_reason"] == "finished", instance_id
        assert row["reward"] == (1.0 if instance_id in right else 0.0), (instance_id, row["result"])
    math_call = found["math-00"]["tool_calls"][0]
    assert (math_call["name"], json.loads(math_call["arguments"]), math_call["output"], math_call["exit_code"]) \
        == ("python", {"code": "17 * 23"}, "391", 0)
    swe = found["intervals-1"]
    assert [c["name"] for c in swe["tool_calls"]] == ["bash", "str_replace_editor", "bash", "finish"]
    assert "start <= result[-1][1]" in json.loads(swe["result"])["patch"]
    assert "4 passed" in swe["tool_calls"][2]["output"] and swe["tool_calls"][2]["exit_code"] == 0
    assert json.loads(found["roman-1"]["result"])["patch"] == ""   # the no-op changed nothing


def test_swe_patch_that_breaks_pass_to_pass_gets_0(scripted_run: dict[str, Any]) -> None:
    result = json.loads(scripted_run["rows"]["textstats-1"]["result"])
    assert scripted_run["rows"]["textstats-1"]["reward"] == 0.0
    assert result["fail_to_pass"] == {"passed": 2, "total": 2}, result
    assert result["pass_to_pass"]["passed"] < result["pass_to_pass"]["total"], result


def test_misbehaving_agents_end_with_a_row_and_the_right_stop_reason(scripted_run: dict[str, Any]) -> None:
    found = scripted_run["rows"]
    for name, reason in EXPECTED_STOP.items():
        assert found[name]["status"] == "ok", (name, found[name]["error"])
        assert found[name]["stop_reason"] == reason, (name, found[name]["stop_reason"])
    malformed = found["abuse-malformed"]
    assert malformed["malformed_calls"] == 4   # bad JSON, unknown tool, bad argument, unclosed tag
    assert [(c["name"], c["exit_code"]) for c in malformed["tool_calls"]][:2] == [("rm_rf", None), ("python", None)]
    assert "unknown tool 'rm_rf'" in malformed["tool_calls"][0]["error"]
    assert malformed["reward"] == 1.0        # the model read the errors and answered
    huge = found["abuse-huge-output"]
    seen = load_tokenizer(tiny_model_dir()).decode(huge["response_ids"])
    assert huge["tool_calls"][0]["output_chars"] >= 3_000_000      # the size before the cut
    assert "characters truncated ...]" in seen and len(seen) < 4000   # head + marker + tail only
    hung = found["abuse-hung-code"]["tool_calls"][0]
    assert hung["error"] == "timeout" and hung["latency_ms"] < 60_000
    assert len(found["abuse-turns"]["turns"]) == 2


def test_a_failing_backend_fails_the_job_with_stop_reason_error(scripted_run: dict[str, Any]) -> None:
    row = scripted_run["rows"]["unscripted"]
    assert (row["status"], row["stop_reason"], row["error_stage"]) == ("failed", "error", "run")
    assert "no script matches" in row["error"]
    assert row["prompt_ids"] and row["turns"] == []   # what the run had is kept


def test_token_record_is_exact(scripted_run: dict[str, Any]) -> None:
    tokenizer = load_tokenizer(tiny_model_dir())
    served = [json.loads(line) for line in scripted_run["record"].read_text().splitlines()]
    by_prompt = {tuple(s["prompt_ids"]): s for s in served}
    checked = 0
    for instance_id, row in scripted_run["rows"].items():
        turns, prompt = row["turns"], row["prompt_ids"]
        response, mask = row["response_ids"], row["response_mask"]
        assert len(response) == len(mask) == len(row["logprobs"])
        position = 0
        for index, turn in enumerate(turns):
            # The prompt of each turn is the first prompt + everything appended so far, verbatim.
            assert turn["input_ids"] == prompt + response[:position], (instance_id, index)
            assert by_prompt[tuple(turn["input_ids"])]["output_ids"] == turn["output_ids"]   # what the server sent
            sampled = turn["output_ids"]
            assert response[position:position + len(sampled)] == sampled
            assert mask[position:position + len(sampled)] == [1] * len(sampled)
            position += len(sampled)
            following = turns[index + 1]["input_ids"][len(prompt):] if index + 1 < len(turns) else response
            observation = following[position:] if index + 1 < len(turns) else response[position:]
            assert mask[position:position + len(observation)] == [0] * len(observation)
            calls = [c for c in row["tool_calls"] if c["turn"] == index + 1 and c["name"] not in ("submit", "finish")]
            if observation and calls and not row["malformed_calls"] and all(len(c["output"]) < 900 for c in calls):
                # verl's rendering: the tool messages alone through the template, after the
                # newline that follows the sampled <|im_end|>.
                messages = [{"role": "tool", "content": c["output"]} for c in calls]
                expected = "\n" + tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                assert observation == tokenizer.encode(expected, add_special_tokens=False), (instance_id, index)
                checked += 1
            position += len(observation)
        assert position == len(response)
    assert checked >= 10


def test_inspect_shows_every_tool_call(scripted_run: dict[str, Any]) -> None:
    import subprocess

    from tests.agents.helpers import CLI

    row = scripted_run["rows"]["intervals-1"]
    shown = subprocess.run(CLI + ["inspect", scripted_run["run_dir"], row["job_id"]], capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "agent: stop_reason=finished turns=4 tool_calls=4 malformed=0" in shown.stdout
    assert "str_replace_editor" in shown.stdout and "-> exit=0" in shown.stdout and " ms" in shown.stdout
    assert "| 4 passed" in shown.stdout   # the output of the agent's own pytest run
