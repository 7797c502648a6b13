"""Hidden tests of a code task: the program runs on their inputs in a sandbox (code_runner.py), and
its outputs are compared here, on the worker, so the expected outputs never enter a sandbox the
program runs in; a checker runs in a sandbox of its own. The reward from the results."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.grading.sandboxed_runner import GRADING_DIR, run_runner

if TYPE_CHECKING:
    from orchestrator.sandbox.base import Sandbox

SCORING = ("all", "share")
SOLUTION = f"{GRADING_DIR}/solution.py"
MIN_OUTPUT_LIMIT = 1 << 20      # bytes a program may print per test, at least (more: twice the expected output)
CHECKER_TIME_S = 30.0
SandboxFactory = Callable[[], AbstractAsyncContextManager["Sandbox"]]


@dataclass(frozen=True)
class TestReport:
    results: tuple[dict[str, Any], ...]
    total: int
    error: str | None = None

    @property
    def passed(self) -> int:
        return sum(r.get("status") == "passed" for r in self.results)

    def reward(self, scoring: str) -> float:
        if self.error or not self.total:
            return 0.0
        if scoring == "share":
            return self.passed / self.total
        return 1.0 if self.passed == self.total else 0.0

    def summary(self) -> dict[str, Any]:
        statuses: dict[str, int] = {}
        for result in self.results:
            statuses[result.get("status", "?")] = statuses.get(result.get("status", "?"), 0) + 1
        return {"tests_total": self.total, "tests_passed": self.passed, "test_statuses": statuses,
                "test_ms": [r.get("ms") for r in self.results], **({"test_error": self.error} if self.error else {})}


def output_limit(tests: list[dict[str, Any]]) -> int:
    return max(MIN_OUTPUT_LIMIT, 2 * max((len(str(t["output"]).encode()) for t in tests), default=0) + 4096)


async def run_hidden_tests(
    sandbox: "Sandbox", solution: str, tests: list[dict[str, Any]], *, time_limit_s: float,
    memory_mb: int, checker: str | None = None, checker_sandbox: SandboxFactory | None = None,
) -> TestReport:
    """Run `solution` on every test's input in `sandbox`, compare (or check, in a fresh sandbox from
    `checker_sandbox`: the program's sandbox is no place for the checker) and report."""
    if not solution.strip():
        return TestReport((), len(tests), "no solution")
    if checker and checker_sandbox is None:
        raise ValueError("a checker runs in a sandbox of its own: pass checker_sandbox (a fresh-sandbox factory)")
    await sandbox.upload(solution.encode(), SOLUTION)
    spec = {"command": ["python3", SOLUTION], "inputs": [str(t["input"]) for t in tests],
            "time_limit_s": time_limit_s, "memory_mb": memory_mb, "output_limit_bytes": output_limit(tests)}
    ran, why = await run_runner(sandbox, "tests", spec, len(tests) * (time_limit_s + 2) + 30)
    if ran is None:
        return TestReport((), len(tests), why)
    results = [dict(r) for r in ran["results"]]
    done = [index for index, r in enumerate(results) if r.get("status") == "ran"]
    if checker and done:
        assert checker_sandbox is not None
        cases = [{"input": str(tests[i]["input"]), "expected": str(tests[i]["output"]), "output": results[i]["output"]}
                 for i in done]
        async with checker_sandbox() as fresh:
            checked, why = await run_runner(fresh, "checks", {"checker": checker, "cases": cases, "memory_mb": 2048,
                                                              "time_limit_s": CHECKER_TIME_S},
                                            len(cases) * (CHECKER_TIME_S + 2) + 30)
        if checked is None:
            return TestReport((), len(tests), f"the checker: {why}")
        verdicts = dict(zip(done, checked["accepted"]))
    else:
        verdicts = {i: str(results[i]["output"]).split() == str(tests[i]["output"]).split() for i in done}
    for index, accepted in verdicts.items():
        del results[index]["output"]
        results[index]["status"] = "passed" if accepted else "wrong_answer"
    return TestReport(tuple(results), len(tests))
