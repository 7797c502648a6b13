"""Every reward rule is stated, in one place (issue 36, items 1 and 2): `hpc-rollout handlers NAME`
prints it, docs/agents.md holds the same table, `submit` refuses a row whose reward_model its
handler would ignore (naming the handlers that would use it), `--source-handler` routes say what
the target computes, and what a truncated answer earns is run.toml's setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.handlers import DOCUMENTED, documented_rules
from orchestrator.config import ConfigError
from orchestrator.devserver.local_server import start_server
from orchestrator.handler_api.reward_rule import DOC_BEGIN, DOC_END, RewardRule, rules_markdown
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.rundir import init_run
from orchestrator.submission.submit import submit_rows
from tests.core.util import FAST, cli, make_run, rows, serve_in_process, write_jsonl

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def verl_row(truth: Any, index: int, source: str = "openai/gsm8k") -> dict[str, Any]:
    return {"data_source": source, "prompt": [{"role": "user", "content": f"Question {index}?"}],
            "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"index": index}}


@pytest.mark.parametrize("family", DOCUMENTED)
def test_handlers_prints_each_family_s_reward_rule(family: str) -> None:
    shown = cli("handlers", family).stdout
    rule = documented_rules()[family]
    assert f"reward rule: {rule.summary[:40]}" in " ".join(shown.split()), shown
    for _, title in RewardRule.FIELDS:
        assert title in shown, (family, title)


def test_the_docs_table_is_generated_from_the_handlers_rules() -> None:
    table = cli("handlers", "--markdown").stdout.strip()
    assert table == rules_markdown(documented_rules())
    assert [line.split("|")[1].strip(" `") for line in table.splitlines()[2:]] == list(DOCUMENTED)
    text = DOC.read_text()
    assert f"{DOC_BEGIN}\n{table}\n{DOC_END}" in text, \
        "docs/agents.md's reward rules differ from the handlers': paste `hpc-rollout handlers --markdown` between its markers"


def test_rows_with_a_ground_truth_the_handler_ignores_are_refused_naming_who_would_use_it(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "gsm8k.jsonl", [verl_row(t, i) for i, t in enumerate(("7", "4", "8", "18", "25"))])
    done = cli("submit", str(paths.root), str(tasks), "--source-handler", "openai/gsm8k=chat", check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    refusals = [line for line in done.stderr.splitlines() if line.startswith(f"{tasks}:")]
    # one line for the reason the five rows share (issue 39: it was printed five times)
    assert len(refusals) == 1 and refusals[0].startswith(f"{tasks}: lines 1, 2, 3, 4, 5: "), done.stderr
    for refusal in refusals:
        assert "chat does not use reward_model" in refusal and "the share of letters" in refusal, refusal
        assert "answer, math (--source-handler openai/gsm8k=NAME)" in refusal, refusal
    # the same rows where they are graded against their truth, and to chat when verl scores them
    assert not submit_rows(paths, enumerate((verl_row("7", 1),), 1), source_handlers={"openai/gsm8k": "answer"}).rejected
    scored = {**verl_row("7", 2), "verl_reward": {"source": "default"}}
    assert not submit_rows(paths, enumerate((scored,), 1), source_handlers={"openai/gsm8k": "chat"}).rejected
    # a harness that reports its own reward, or swe (tests, not a ground truth), ignore it too
    harness = {**verl_row("7", 3), "harness": {"command": "true", "family": "math", "reward": "reported"}}
    report = submit_rows(paths, enumerate((harness,), 1), handler="harness")
    assert "harness.reward = reported does not use reward_model" in report.rejected[0].reason


def test_source_handler_routes_say_what_reward_the_target_computes(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "gsm8k.jsonl", [verl_row("7", 0)])
    done = cli("submit", str(paths.root), str(tasks), "--source-handler", "openai/gsm8k=answer")
    rule = documented_rules()["answer"]
    assert f"data_source openai/gsm8k -> answer: reward {rule.summary}" in " ".join(done.stdout.split()), done.stdout
    report = json.loads(cli("submit", str(paths.root), str(tasks), "--source-handler", "openai/gsm8k=answer",
                            "--json").stdout)
    assert report["routes"] == {"openai/gsm8k": "answer"}


def test_what_a_truncated_answer_earns_is_a_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rewards.truncated_reward"):
        init_run(tmp_path / "bad", {"rewards.truncated_reward": "nan"})
    scripts = write_jsonl(tmp_path / "scripts.jsonl", [{"match": "Cut me.", "replies": ["#### 7 " + "and more " * 30]},
                                                       {"match": "Whole.", "replies": ["#### 7"]}])
    server = start_server(tiny=True, extra_args=["--scripted", str(scripts)])
    try:
        paths, _ = init_run(tmp_path / "run", {**FAST, "rewards.truncated_reward": -0.5})
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=0)
        tasks = [{"instance_id": name, "prompt": [{"role": "user", "content": text}],
                  "reward_model": {"ground_truth": "7"}} for name, text in (("cut", "Cut me."), ("whole", "Whole."))]
        assert not submit_rows(paths, enumerate(tasks, 1), handler="answer", sampling={"max_tokens": 8}).rejected
        serve_in_process(paths, timeout=120)
    finally:
        server.stop()
    found = {r["instance_id"]: r for r in rows(paths)}
    assert (found["cut"]["stop_reason"], found["cut"]["reward"]) == ("truncated", -0.5)
    assert (found["whole"]["stop_reason"], found["whole"]["reward"]) == ("finished", 1.0)
