"""Hidden tests of a code task, run in a sandbox by code_runner.py; the reward from their results."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.sandbox.base import Sandbox

RUNNER = Path(__file__).with_name("code_runner.py")
SCORING = ("all", "share")


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


async def run_hidden_tests(
    sandbox: "Sandbox", solution: str, tests: list[dict[str, Any]], *, time_limit_s: float,
    memory_mb: int, checker: str | None = None, stop_on_failure: bool = False,
) -> TestReport:
    """Upload the solution, the tests and the runner into `sandbox`, run them, read the results."""
    if not solution.strip():
        return TestReport((), len(tests), "no solution")
    spec = {"command": ["python3", "solution.py"], "tests": tests, "time_limit_s": time_limit_s,
            "memory_mb": memory_mb, "checker": "checker.py" if checker else None,
            "stop_on_failure": stop_on_failure}
    await sandbox.upload(solution.encode(), "solution.py")
    await sandbox.upload(json.dumps(spec).encode(), ".grading/spec.json")
    await sandbox.upload(RUNNER, ".grading/runner.py")
    if checker:
        await sandbox.upload(checker.encode(), "checker.py")
    budget = len(tests) * (time_limit_s + 2) + 30
    ran = await sandbox.bash("python3 .grading/runner.py .grading/spec.json .grading/result.json", timeout=budget)
    fetched = await sandbox.download(".grading/result.json")
    if fetched.error or fetched.content is None:
        return TestReport((), len(tests), f"the test runner failed (exit {ran.exit_code}): {ran.output[-500:]}")
    results = tuple(json.loads(fetched.content)["results"])
    return TestReport(results, len(tests))
