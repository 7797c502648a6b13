"""`code`: a programming problem with hidden stdin/stdout tests (Codeforces / Eurus style).

The agent writes `solution.py` in its sandbox (bash, python, editor) and may run it on the
examples; EVAL runs the hidden tests in a fresh sandbox, each under a time and a memory limit.
Rows: {"statement": "...", "tests": [{"input": "1 2\\n", "output": "3\\n"}, ...],
       "examples": [...] (shown to the agent; default: the first test), "checker": "python source"
       (optional: `python3 checker.py INPUT EXPECTED OUTPUT` exits 0 when OUTPUT is right),
       "solution": "python source" (the golden one, for `tasks check`), "time_limit_s": 2,
       "memory_mb": 512, "scoring": "all" (1 only when every test passes) | "share"}
or verl rows whose reward_model.ground_truth is {"inputs": [...], "outputs": [...]} (or its JSON,
or a list of {"input", "output"}), extra fields in extra_info. Without a solution.py, the last
```python block of the agent's replies is the solution.
Reward: RULE below (`hpc-rollout handlers code`). The hidden tests never enter the agent's sandbox,
nor their expected outputs the sandbox the solution runs in at EVAL (orchestrator/grading/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hpc_rollout.handlers.task_rows import first_text, flatten, json_value, optional_image, prompt_messages
from orchestrator.agent.tool_handler import ToolAgentHandler, agent_task_keys, fresh_sandbox
from orchestrator.agent.loop import AgentLimits, AgentRun, TextReply
from orchestrator.grading.code_tests import SCORING, run_hidden_tests
from orchestrator.handler_api.reward_rule import RewardRule
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext
    from orchestrator.sandbox.base import Sandbox

SOLUTION_FILE = "solution.py"
FENCED = re.compile(r"```(?:python|py|python3)?\s*\n(.*?)```", re.DOTALL)
SYSTEM = ("Write a Python 3 program that reads the input from standard input and prints the answer "
          f"to standard output. Save it as {SOLUTION_FILE} in the working directory, run it on the "
          "examples with the bash tool (e.g. printf '1 2\\n' | python3 solution.py), fix it until it "
          "is right, then call finish.")


LIMITS = AgentLimits(max_turns=16, max_context_tokens=8192, max_wall_s=600, tool_timeout_s=30,
                     max_observation_chars=4000, text_reply=TextReply.NUDGE)
TESTS = (Kind.LIST, Kind.OBJECT, Kind.STRING)
SCHEMA = InstanceSchema((
    instance_key("statement", Kind.STRING, "the problem (or 'problem' / 'question'; or a verl 'prompt')"),
    instance_key("problem", Kind.STRING, "the problem, another name"),
    instance_key("question", Kind.STRING, "the problem, another name"),
    instance_key("tests", TESTS, "hidden tests: [{input, output}], {inputs: [...], outputs: [...]}, or their JSON "
        "(or verl reward_model.ground_truth)"),
    instance_key("ground_truth", TESTS, "hidden tests, another name"),
    instance_key("examples", TESTS, "tests shown to the agent", default="the first test"),
    instance_key("checker", (Kind.STRING, Kind.NULL), "Python source: `python3 checker.py INPUT EXPECTED OUTPUT` exits 0 "
        "when OUTPUT is right (default: the output must equal EXPECTED)"),
    instance_key("solution", (Kind.STRING, Kind.NULL), "the golden solution's Python source (for `tasks check`)"),
    instance_key("time_limit_s", Kind.NUMBER, "seconds per test, in [0.1, 600]", default=2.0),
    instance_key("memory_mb", Kind.INTEGER, "MiB per test, in [32, 65536]", default=512),
    instance_key("scoring", Kind.STRING, f"{' | '.join(SCORING)}: 1 only when every test passes, or the share passed",
        default="all"),
    *agent_task_keys(LIMITS),
), accepts_verl_rows=True)


RULE = RewardRule(
    summary="1 when the solution passes every hidden test (`scoring: share`: the share passed), else 0",
    graded="the agent's `solution.py` (else the last fenced Python block of its replies), run on each hidden test's "
           "input in a fresh sandbox under the time and memory limits; only the inputs go in, the outputs come out "
           "and are compared on the worker; whatever the program leaves running is killed after each test",
    against="`tests` (verl: `reward_model.ground_truth`): the output's whitespace-separated tokens equal the expected "
            "ones, or the row's `checker` accepts them (run in a sandbox of its own)",
    range="0 or 1 (`scoring: all`); the share of tests passed, in [0, 1] (`share`)",
    truncated="graded as it stands (a reply cut at the length limit is nudged to go on)",
    failed="no reward (null, status `failed`); a test over its time, memory or output limit, a crash, an early exit, "
           "or a killed test runner counts as failed tests, never better",
    ground_truth="the hidden tests")


@dataclass(frozen=True)
class CodeTask:
    statement: str
    tests: tuple[dict[str, str], ...]
    examples: tuple[dict[str, str], ...]
    checker: str | None = None
    solution: str | None = None
    time_limit_s: float = 2.0
    memory_mb: int = 512
    scoring: str = "all"
    prompt: tuple[dict[str, Any], ...] | None = None
    image: str | None = None


def _tests(value: Any, what: str) -> tuple[dict[str, str], ...]:
    value = json_value(value, what)
    if isinstance(value, dict) and "inputs" in value and "outputs" in value:
        inputs, outputs = value["inputs"], value["outputs"]
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise ValueError(f"{what}: 'inputs' and 'outputs' must be lists of the same length")
        value = [{"input": i, "output": o} for i, o in zip(inputs, outputs)]
    if not isinstance(value, list) or not value:
        raise ValueError(f"{what} must be a non-empty list of {{'input', 'output'}} "
                         "(or {'inputs': [...], 'outputs': [...]})")
    tests = []
    for index, test in enumerate(value):
        if not isinstance(test, dict) or not isinstance(test.get("input"), str) \
                or not isinstance(test.get("output"), str):
            raise ValueError(f"{what}[{index}] must be {{'input': str, 'output': str}}")
        tests.append({"input": test["input"], "output": test["output"]})
    return tuple(tests)


def code_task(instance: dict[str, Any]) -> CodeTask:
    fields = flatten(instance)
    prompt = prompt_messages(fields)
    statement = first_text(fields, ("statement", "problem", "question")) or ""
    if prompt is None and not statement:
        raise ValueError("a code task needs 'statement' (or 'problem' / 'question'), or a verl 'prompt'")
    hidden = fields.get("tests", fields.get("ground_truth"))
    if hidden is None:
        raise ValueError("a code task needs hidden tests: 'tests' (or verl reward_model.ground_truth)")
    tests = _tests(hidden, "tests")
    examples = _tests(fields["examples"], "examples") if fields.get("examples") else tests[:1]
    scoring = fields.get("scoring", SCHEMA.default("scoring"))
    if scoring not in SCORING:
        raise ValueError(f"'scoring' must be one of {', '.join(SCORING)}, got {scoring!r}")
    for key in ("checker", "solution"):
        if fields.get(key) is not None and not isinstance(fields[key], str):
            raise ValueError(f"'{key}' must be Python source text")
    time_limit, memory = fields.get("time_limit_s", SCHEMA.default("time_limit_s")), fields.get("memory_mb", SCHEMA.default("memory_mb"))
    if not isinstance(time_limit, (int, float)) or not 0.1 <= time_limit <= 600:
        raise ValueError("'time_limit_s' must be a number of seconds in [0.1, 600]")
    if not isinstance(memory, int) or not 32 <= memory <= 65536:
        raise ValueError("'memory_mb' must be a whole number of MiB in [32, 65536]")
    return CodeTask(statement, tests, examples, fields.get("checker"), fields.get("solution"),
                    float(time_limit), memory, scoring, tuple(prompt) if prompt else None,
                    optional_image(fields))


def solution_from_replies(run: AgentRun) -> str:
    for message in reversed(run.conversation.messages):
        if message.get("role") == "assistant":
            blocks = FENCED.findall(str(message.get("content") or ""))
            if blocks:
                return blocks[-1]
    return ""


def eval_limits(task: CodeTask) -> dict[str, int]:
    """Limits of EVAL's sandbox: room for the row's memory limit, CPU time for every test."""
    return {"memory_mb": max(1024, 2 * task.memory_mb), "cpu_seconds": int(len(task.tests) * (task.time_limit_s + 1)) + 60}


class CodeHandler(ToolAgentHandler):
    name: ClassVar[str] = "code"
    instance_schema = SCHEMA
    reward_rule = RULE
    tools: ClassVar[tuple[str, ...]] = ("bash", "python", "str_replace_editor", "think", "finish")
    limits: ClassVar[AgentLimits] = LIMITS

    def task(self, instance: dict[str, Any]) -> CodeTask:
        return code_task(instance)

    def messages(self, task: CodeTask) -> list[dict[str, Any]]:
        if task.prompt is not None:
            return [dict(m) for m in task.prompt]
        shown = "\n".join(f"Example {n}\ninput:\n{t['input']}\noutput:\n{t['output']}"
                          for n, t in enumerate(task.examples, 1))
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{task.statement}\n\n{shown}"}]

    def sandbox_request(self, instance: dict[str, Any]) -> dict[str, Any]:
        task = self.task(instance)
        return {**self.sandbox_options(task), "limits": eval_limits(task)}   # EVAL's sandbox asks for the most

    async def collect(self, ctx: "JobContext", sandbox: "Sandbox", run: AgentRun, task: CodeTask) -> dict[str, Any]:
        fetched = await sandbox.download(SOLUTION_FILE)
        if fetched.error is None and fetched.content is not None:
            return {"solution": fetched.content.decode("utf-8", "replace"), "solution_source": SOLUTION_FILE}
        return {"solution": solution_from_replies(run), "solution_source": "reply"}

    def reference_result(self, task: CodeTask, which: str) -> dict[str, Any]:
        if which == "golden" and not task.solution:
            raise ValueError("the task has no golden 'solution' to check")
        return {"solution": task.solution if which == "golden" else ""}

    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        task = self.task(ctx.job.instance)
        solution = str(result.get("solution") or "")
        if not solution.strip():
            return {"reward": 0.0, "tests_total": len(task.tests), "tests_passed": 0, "test_error": "no solution"}
        options = {"limits": eval_limits(task), **self.sandbox_options(task)}
        async with fresh_sandbox(ctx, **options) as sandbox:
            report = await run_hidden_tests(sandbox, solution, list(task.tests), time_limit_s=task.time_limit_s,
                                            memory_mb=task.memory_mb, checker=task.checker,
                                            checker_sandbox=lambda: fresh_sandbox(ctx, **options))
        return {"reward": report.reward(task.scoring), **report.summary()}
