"""reasoning-gym as a task family (issue 40, item 4): rows from its generators, checked at submit,
asked of the policy, and scored by each dataset's own `score_answer`; answers that are huge, play
with the `<answer>` tags or echo the question earn nothing."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

if not os.environ.get("CI"):   # CI installs the test extra, which holds it: there it must be present
    pytest.importorskip("reasoning_gym", reason="pip install -e '.[test]' (or '.[reasoning-gym]') installs it")

from hpc_rollout.handlers.reasoning_gym_answers import extract_answer
from hpc_rollout.handlers.reasoning_gym_data import ReasoningGymMissing, reasoning_gym_rows
from hpc_rollout.handlers.reasoning_gym_task import ReasoningGymHandler
from orchestrator.devserver.local_server import start_server
from orchestrator.handler_api.context import JobContext, WorkerServices
from orchestrator.handler_api.contract import check_instance, load_handler
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import SpoolPaths
from orchestrator.submission.submit import submit_rows
from tests.core.util import cli, drain_with_a_worker, make_run, rows, write_jsonl


def context(tmp_path: Path, instance: dict[str, Any], stage: Stage, runtime: str = "bwrap") -> JobContext:
    job = JobSpec(job_id=f"rg-{stage.value}", group_id="rg", instance_id="rg", sample_index=0,
                  handler="reasoning_gym", instance=instance)
    services = WorkerServices(paths=SpoolPaths.of(tmp_path / "spool"), worker_id="test", node="here", runtime=runtime)
    return JobContext(job=job, stage=stage, attempt=1, services=services)


def graded(tmp_path: Path, instance: dict[str, Any], reply: str, runtime: str = "bwrap",
           stop_reason: str = "finished") -> dict[str, Any]:
    """The handler's INIT, then its EVAL of a RUN that replied `reply` (no model needed)."""
    handler = ReasoningGymHandler()
    prepared = asyncio.run(handler.init(context(tmp_path, instance, Stage.INIT)))
    result = {**handler.carried(prepared), "reply": reply, "stop_reason": stop_reason}
    return asyncio.run(handler.eval(context(tmp_path, instance, Stage.EVAL, runtime), result))


def refusal(instance: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as caught:
        check_instance(load_handler("reasoning_gym"), instance)
    return str(caught.value)


def entry_of(row: dict[str, Any]) -> dict[str, Any]:
    import reasoning_gym

    return reasoning_gym.create_dataset(row["dataset"], seed=row["seed"], size=row["size"],
                                        **row.get("options", {}))[row["index"]]


def test_rows_from_the_source_for_two_datasets() -> None:
    legs = reasoning_gym_rows("leg_counting", size=4, seed=1)
    words = reasoning_gym_rows("spell_backward", size=3, seed=2, min_word_len=4, max_word_len=6)
    assert [r["index"] for r in legs] == [0, 1, 2, 3] and len(words) == 3
    assert legs[1] == {"instance_id": "leg_counting-s1-1", "dataset": "leg_counting", "seed": 1, "size": 4, "index": 1}
    assert words[0]["options"] == {"min_word_len": 4, "max_word_len": 6}
    handler = load_handler("reasoning_gym")
    for row in legs + words:
        check_instance(handler, row)
    assert 4 <= len(entry_of(words[2])["answer"]) <= 6
    # the same rows from the command line, one JSON object a line
    shown = cli("tasks", "reasoning-gym", "spell_backward", "--size", "3", "--seed", "2",
                "--option", "min_word_len=4", "--option", "max_word_len=6").stdout
    assert [json.loads(line) for line in shown.splitlines()] == words
    listed = cli("tasks", "reasoning-gym", "--list").stdout
    assert "leg_counting" in listed and "spell_backward" in listed and "105 datasets" in listed


def test_the_tasks_commands_name_the_family(tmp_path: Path) -> None:
    assert "reasoning_gym  reasoning-gym's 105 procedural datasets" in cli("tasks", "--help").stdout
    written = " ".join(cli("tasks", "bundled", str(tmp_path / "bundled")).stdout.split())
    assert "reasoning_gym: 105 reasoning-gym datasets" in written, written
    assert "hpc-rollout tasks reasoning-gym --list" in written, written


def test_tasks_check_grades_each_row_s_expected_answer_1_and_no_answer_0(tmp_path: Path) -> None:
    rows_file = write_jsonl(tmp_path / "rows.jsonl", reasoning_gym_rows("leg_counting", size=2, seed=1)
                            + reasoning_gym_rows("spell_backward", size=1, seed=1))
    done = cli("tasks", "check", str(rows_file), "--handler", "reasoning_gym", "--runtime", "bwrap")
    assert "3 tasks checked: 3 ok, 0 failing" in done.stdout, done.stdout + done.stderr


def test_unknown_datasets_and_bad_options_are_refused_with_the_dataset_s_own_words() -> None:
    row = reasoning_gym_rows("leg_counting", size=2, seed=1)[0]
    unknown = refusal({**row, "dataset": "leg_countin"})
    assert "unknown reasoning-gym dataset 'leg_countin'" in unknown and "'leg_counting'" in unknown
    assert "hpc-rollout tasks reasoning-gym --list" in unknown
    assert "min_animals must be positive" in refusal({**row, "options": {"min_animals": 0}})
    misnamed = refusal({**row, "options": {"max_legs": 3}})
    assert "max_legs" in misnamed and "min_animals" in misnamed   # its error, then the options it takes
    assert "index 2 is outside the dataset (size 2" in refusal({**row, "index": 2})
    # a row is data: no files of the worker, no second seed, no mix chosen by a row
    assert "names a file" in refusal({**reasoning_gym_rows("spell_backward", size=1, seed=1)[0],
                                      "options": {"data_file": "../../../../etc/passwd"}})
    assert "seed" in refusal({**row, "options": {"seed": 3}})
    assert "composite" in refusal({**row, "dataset": "composite"})
    with pytest.raises(ValueError, match="close matches: 'leg_counting'"):
        reasoning_gym_rows("leg_countng", size=1, seed=1)
    done = cli("tasks", "reasoning-gym", "leg_counting", "--size", "2", "--option", "min_animals=0", check=False)
    assert done.returncode == 1 and "min_animals must be positive" in done.stderr, done.stderr


def test_a_missing_reasoning_gym_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "reasoning_gym", None)   # `import reasoning_gym` now fails
    with pytest.raises(ReasoningGymMissing, match=r"pip install 'hpc-rollout\[reasoning-gym\]'"):
        load_handler("reasoning_gym").validate_instance({"dataset": "leg_counting", "seed": 1, "size": 1, "index": 0})


def test_eval_scores_with_the_dataset_s_own_scorer(tmp_path: Path) -> None:
    row = reasoning_gym_rows("leg_counting", size=3, seed=5)[2]
    truth = entry_of(row)["answer"]
    right = graded(tmp_path, row, f"Counting... <answer>{truth}</answer>")
    assert (right["reward"], right["graded"], right["scorer"]) == (1.0, "answer tag", "in process")
    assert graded(tmp_path, row, f"<answer>{int(truth) + 1}</answer>")["reward"] == 0.0
    assert graded(tmp_path, row, f"The answer is {truth}.")["reward"] == 0.0   # no tag: nothing is graded
    cut = graded(tmp_path, row, f"<answer>{truth}</answer>", stop_reason="truncated")
    assert (cut["reward"], cut["graded"]) == (0.0, "truncated: not graded")


def test_scorers_that_may_run_the_answer_run_it_in_a_scorer_sandbox(tmp_path: Path) -> None:
    # spell_backward overrides score_answer; n_queens' hands the answer to eval(): both run sandboxed
    word = reasoning_gym_rows("spell_backward", size=2, seed=3)[1]
    truth = entry_of(word)["answer"]
    right = graded(tmp_path, word, f"<answer>{truth}</answer>")
    assert (right["reward"], right["scorer"]) == (1.0, "scorer sandbox")
    near = graded(tmp_path, word, f"<answer>{truth}x</answer>")   # its scorer: 1 per matching position, less 0.2
    assert near["reward"] == pytest.approx(0.8) and near["scorer"] == "scorer sandbox"
    assert graded(tmp_path, word, "<answer>-1</answer>")["reward"] == 0.0
    queens = reasoning_gym_rows("n_queens", size=1, seed=1)[0]
    board = [line.split() for line in entry_of(queens)["answer"].splitlines()]
    marker = tmp_path / "ran-on-the-worker"
    # code that writes a file of the worker, then yields the right board: it runs (a score), but not here
    attack = (f"<answer>(__import__('os').makedirs('{tmp_path}', exist_ok=True), "
              f"__import__('pathlib').Path('{marker}').write_text('pwned'), {board!r})[2]</answer>")
    ran = graded(tmp_path, queens, attack)
    assert ran["reward"] > 0 and ran["scorer"] == "scorer sandbox", ran
    assert not marker.exists(), "the model's answer ran on the worker"
    with pytest.raises(ValueError, match="no sandbox"):
        graded(tmp_path, queens, attack, runtime="local")
    assert not marker.exists()


def test_a_huge_answer_earns_nothing(tmp_path: Path) -> None:
    row = reasoning_gym_rows("leg_counting", size=1, seed=7)[0]
    truth = entry_of(row)["answer"]
    huge = graded(tmp_path, row, "<answer>" + " ".join(str(n) for n in range(200_000)) + f" {truth}</answer>")
    assert huge["reward"] == 0.0 and "characters" in huge["graded"], huge


def test_tags_that_try_to_confuse_the_extraction_earn_nothing(tmp_path: Path) -> None:
    row = reasoning_gym_rows("leg_counting", size=1, seed=8)[0]
    truth = entry_of(row)["answer"]
    tricks = [f"<answer>{truth}</answer> on second thought <answer>0</answer>",   # the last answer counts
              f"<think><answer>{truth}</answer></think><answer>no idea</answer>",
              f"<answer>{truth}",                                                  # never closed
              f"</answer>{truth}<answer>",                                         # closed before opened
              f'<answer type="final">{truth}</answer>',                            # not the tag
              f"<answer>0<answer>{truth}</answer>0</answer>"]                      # nested: the innermost last
    for trick in tricks[:-1]:
        assert graded(tmp_path, row, trick)["reward"] == 0.0, trick
    # extraction as reasoning-gym's extract_answer does it, where tags are not nested
    from reasoning_gym.utils import extract_answer as theirs
    for text in ("<answer> 12 </answer>", "a <answer>1</answer> b <answer>2\n</answer> c", "none", "<answer></answer>"):
        assert extract_answer(text) == theirs(text), text
    assert extract_answer(tricks[-1]) == truth


def test_an_echoed_question_earns_nothing(tmp_path: Path) -> None:
    # count_primes keeps reasoning-gym's default scorer, which gives an answer holding the true one
    # partial credit (len(truth) / len(answer)): a question that holds its answer would earn some.
    import reasoning_gym

    dataset = reasoning_gym.create_dataset("count_primes", seed=1, size=200)
    index = next(i for i in range(200) if dataset[i]["answer"] in dataset[i]["question"])
    entry = dataset[index]
    assert dataset.score_answer(answer=entry["question"], entry=entry) > 0   # what the echo would earn raw
    row = reasoning_gym_rows("count_primes", size=200, seed=1)[index]
    echo = graded(tmp_path, row, f"<answer>{entry['question']}</answer>")
    assert echo["reward"] == 0.0 and "echo" in echo["graded"], echo
    assert graded(tmp_path, row, f"<answer>{entry['answer']}</answer>")["reward"] == 1.0


def test_end_to_end_rewards_as_reasoning_gym_scores_them(tmp_path: Path) -> None:
    """A real local worker, the scripted policy of serve-llm --tiny: right for some rows, wrong for others."""
    import reasoning_gym

    tasks = reasoning_gym_rows("leg_counting", size=2, seed=11) + reasoning_gym_rows("spell_backward", size=2, seed=12)
    scripts, wanted = [], {}
    for number, row in enumerate(tasks):
        entry = entry_of(row)
        answer = entry["answer"] if number % 2 == 0 else "-1"   # right for the first of each dataset
        scripts.append({"match": entry["question"].strip(), "replies": [f"<answer>{answer}</answer>"]})
        scorer = reasoning_gym.create_dataset(row["dataset"], seed=row["seed"], size=row["size"]).score_answer
        wanted[row["instance_id"]] = scorer(answer=answer, entry=entry)
    assert sorted(wanted.values()) == [0.0, 0.0, 1.0, 1.0]
    server = start_server(tiny=True, extra_args=["--scripted", str(write_jsonl(tmp_path / "scripts.jsonl", scripts))])
    try:
        paths = make_run(tmp_path / "run", **{"sandbox.runtime": "bwrap"})
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=0)
        report = submit_rows(paths, enumerate(tasks, 1), handler="reasoning_gym", sampling={"max_tokens": 64})
        assert not report.rejected, report.rejected
        drain_with_a_worker(paths, timeout=90)
    finally:
        server.stop()
    found = {row["instance_id"]: row for row in rows(paths)}
    assert {name: row["reward"] for name, row in found.items()} == wanted, found
    scorers = {name: json.loads(row["result"])["scorer"] for name, row in found.items()}
    assert scorers == {"leg_counting-s11-0": "in process", "leg_counting-s11-1": "in process",
                       "spell_backward-s12-0": "scorer sandbox", "spell_backward-s12-1": "scorer sandbox"}


def test_rows_whose_scorer_runs_code_are_refused_at_submit_under_the_local_runtime(tmp_path: Path) -> None:
    """They failed only at EVAL, after their LLM turns were paid for (the handler's code_scorer hook)."""
    paths = make_run(tmp_path / "run", **{"sandbox.runtime": "local"})
    legs = reasoning_gym_rows("leg_counting", size=1, seed=1)            # the default scorer: compared as strings
    words = reasoning_gym_rows("spell_backward", size=1, seed=1)          # its own scorer: a scorer sandbox
    report = submit_rows(paths, enumerate([*legs, *words], 1), handler="reasoning_gym")
    assert report.tasks == 1 and [p.line for p in report.rejected] == [2], report.rejected
    assert "spell_backward scorer may run the model's output as code" in report.rejected[0].reason
    assert "runtime" in report.rejected[0].reason
