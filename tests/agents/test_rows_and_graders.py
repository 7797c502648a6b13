"""Task rows (own and verl), submit of verl rows, and the graders: math-verify, JUnit, code runner."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpc_rollout.handlers.code_task import code_task
from hpc_rollout.handlers.math_task import candidate, math_task
from hpc_rollout.handlers.swe_task import swe_task
from orchestrator.spool.batches import queued_tickets
from orchestrator.grading.code_tests import run_hidden_tests
from orchestrator.grading.junit import resolution, statuses
from orchestrator.grading.math_answers import MathVerifier
from orchestrator.spool.rundir import init_run
from orchestrator.submission.submit import submit_file
from tests.agents.conftest import needs_bwrap
from tests.sandbox.helpers import started, with_sandbox

VERL_MATH = {"data_source": "math", "prompt": [{"role": "user", "content": "What is 17 * 23?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "391"},
             "extra_info": {"index": 7, "split": "train"}}


def test_verl_rows_for_math_are_accepted_by_submit(tmp_path: Path) -> None:
    paths, _ = init_run(tmp_path / "run")
    jsonl = tmp_path / "deepscaler.jsonl"
    jsonl.write_text(json.dumps(VERL_MATH) + "\n")
    parquet = tmp_path / "deepscaler.parquet"
    pq.write_table(pa.Table.from_pylist([VERL_MATH, {**VERL_MATH, "extra_info": {"index": 8}}]), parquet)
    for source, jobs in ((jsonl, 2), (parquet, 4)):
        report = submit_file(paths, source, samples=2)
        assert report.rejected == [] and report.jobs == jobs
    ticket = queued_tickets(paths.init_queue)[0]
    assert (ticket.job.handler, ticket.job.instance_id, ticket.job.data_source) == ("math", "7", "math")
    # the same row sent to the chat handler, which would ignore its ground truth, is refused naming who would not
    jsonl.write_text(json.dumps({**VERL_MATH, "data_source": "chat"}) + "\n")
    refused = submit_file(paths, jsonl)
    assert refused.jobs == 0 and "chat does not use reward_model" in refused.rejected[0].reason
    assert "answer, math" in refused.rejected[0].reason
    without_truth = {k: v for k, v in VERL_MATH.items() if k != "reward_model"}   # its verl `prompt` is the conversation
    jsonl.write_text(json.dumps({**without_truth, "data_source": "chat"}) + "\n")
    assert submit_file(paths, jsonl).jobs == 1
    jsonl.write_text(json.dumps({**VERL_MATH, "data_source": "chat", "prompt": []}) + "\n")
    refused = submit_file(paths, jsonl)
    assert refused.jobs == 0 and "'prompt' must be a non-empty list" in refused.rejected[0].reason
    task = math_task(VERL_MATH)
    assert (task.answer, task.prompt) == ("391", ({"role": "user", "content": "What is 17 * 23?"},))


def test_rows_are_checked_with_clear_errors() -> None:
    with pytest.raises(ValueError, match="needs its answer"):
        math_task({"problem": "1+1?"})
    with pytest.raises(ValueError, match="hidden tests"):
        code_task({"statement": "x"})
    with pytest.raises(ValueError, match="'scoring' must be one of all, share"):
        code_task({"statement": "x", "tests": [{"input": "", "output": ""}], "scoring": "most"})
    verl_code = code_task({"data_source": "code", "prompt": [{"role": "user", "content": "A+B"}],
                           "reward_model": {"ground_truth": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})}})
    assert verl_code.tests == ({"input": "1 2\n", "output": "3\n"},)
    with pytest.raises(ValueError, match="repo_mirror"):
        swe_task({"instance_id": "a", "base_commit": "abcdef1", "test_patch": "x", "problem_statement": "p",
                  "FAIL_TO_PASS": '["t.py::x"]'})
    swe = swe_task({"instance_id": "a", "base_commit": "abcdef1", "test_patch": "x", "problem_statement": "p",
                    "FAIL_TO_PASS": '["t.py::x"]', "PASS_TO_PASS": "[]", "image": "/img"})
    assert swe.fail_to_pass == ("t.py::x",) and swe.test_files == ["t.py"]
    assert candidate({"answer": "3/4"}) == "$3/4$" and candidate({"final_text": "so \\boxed{2}"}) == "$2$"
    assert candidate({"final_text": "so it is 2"}) == ""     # free text is never graded


def test_math_verify_equivalences_and_its_bound() -> None:
    verifier = MathVerifier()
    try:
        assert verifier.check("\\frac{3}{4}", "$0.75$").correct
        assert verifier.check("2\\sqrt{2}", "\\boxed{2\\sqrt 2}").correct
        assert verifier.check("391", "The answer is \\boxed{391}.").correct
        assert not verifier.check("391", "$390$").correct
        assert not verifier.check("5", "").correct
    finally:
        verifier.close()


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok" file="tests/test_a.py" line="1"/>
<testcase classname="tests.test_a.TestGroup" name="test_param[1-2]" file="tests/test_a.py" line="5"><failure message="x"/></testcase>
<testcase classname="tests.test_a" name="test_skip" file="tests/test_a.py" line="9"><skipped/></testcase>
<testcase classname="tests.test_a" name="test_err" file="tests/test_a.py" line="9"><error message="boom"/></testcase>
</testsuite></testsuites>"""


def test_junit_node_ids_and_resolution() -> None:
    found = statuses(JUNIT)
    assert found == {"tests/test_a.py::test_ok": "PASSED", "tests/test_a.py::TestGroup::test_param[1-2]": "FAILED",
                     "tests/test_a.py::test_skip": "SKIPPED", "tests/test_a.py::test_err": "ERROR"}
    assert resolution(found, ["tests/test_a.py::test_ok"], []).resolved
    assert not resolution(found, ["tests/test_a.py::test_ok"], ["tests/test_a.py::test_missing"]).resolved


@needs_bwrap
def test_code_runner_reports_each_failure_kind(spool, task_image: Path) -> None:  # type: ignore[no-untyped-def]
    solution = ("import sys\nn = int(sys.stdin.read())\n"
                "if n == 1: print(2)\nelif n == 2: raise SystemExit(3)\nelif n == 3:\n    while True: pass\n"
                "elif n == 4: x = bytearray(600 << 20)\nelse: print(n * 2)\n")
    tests = [{"input": f"{n}\n", "output": f"{n * 2 + (n == 1)}\n"} for n in (1, 2, 3, 4, 5)]  # 1 -> 3: wrong

    async def body(sandbox):  # type: ignore[no-untyped-def]
        return await run_hidden_tests(sandbox, solution, tests, time_limit_s=1.0, memory_mb=256)

    report = with_sandbox(spool, body, image=str(task_image))
    assert [r["status"] for r in report.results] == \
        ["wrong_answer", "runtime_error", "time_limit", "memory_limit", "passed"]
    assert report.reward("all") == 0.0 and report.reward("share") == pytest.approx(0.2)
    checker = "import sys\nsys.exit(0 if open(sys.argv[3]).read().strip() == 'ok' else 1)\n"

    @asynccontextmanager
    async def checker_sandbox():  # type: ignore[no-untyped-def]
        fresh = await started(spool, job_id="t-000001-001", image=str(task_image))
        try:
            yield fresh
        finally:
            await fresh.close()

    async def checked(sandbox):  # type: ignore[no-untyped-def]
        return await run_hidden_tests(sandbox, "print('ok')", [{"input": "", "output": "anything"}],
                                      time_limit_s=2, memory_mb=256, checker=checker, checker_sandbox=checker_sandbox)

    assert with_sandbox(spool, checked, image=str(task_image)).reward("all") == 1.0
    assert asyncio.run(run_hidden_tests(None, "  ", tests, time_limit_s=1, memory_mb=64)).error == "no solution"  # type: ignore[arg-type]
