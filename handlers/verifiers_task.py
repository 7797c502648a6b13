"""`verifiers`: one task of a verifiers v1 taskset (github.com/PrimeIntellect-ai/verifiers), run by
verifiers itself with the taskset's harness inside the job's sandbox, scored by the taskset's own
`@vf.reward` functions (docs/agents.md "Bring your environment: verifiers").

    {"verifiers": {"taskset": "my_taskset", "path": "/shared/envs", "index": 3, "harness": "null",
                   "venv": "/shared/venvs/verifiers-0.4.0"}}

`taskset` is the id verifiers imports (a module or package exporting a Taskset subclass in
`__all__`, or one of verifiers' own); `path` a folder holding it, bound read-only into the
sandbox and put first on sys.path; `index` the task's position in the taskset; `harness` a
verifiers harness id (default: the taskset's, else verifiers' `bash`); `taskset_options` and
`harness_options` their config fields; `venv` a virtualenv with verifiers made from the python3
the sandbox image has (bound read-only at /verifiers). Both binds must lie in a directory run.toml
[sandbox] allowed_binds allows.

This is the `harness` handler with a fixed command: INIT starts an empty workspace and uploads
verifiers_rollout.py and its spec; RUN runs it through the relay, so verifiers' model client and
its interception server reach the job's recording proxy (streamed chat completions) and every call
is recorded: the row's token ids, masks and log-probs come from that record, as for any harness.
EVAL is the reward verifiers computed in the sandbox (the trace's weighted sum of its rewards),
written to $HPC_ROLLOUT_REWARD_FILE; a rollout that errs before scoring fails the job, saying why.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hpc_rollout.handlers.harness_reward import RewardSource, reported_reward
from hpc_rollout.handlers.harness_clis import HARNESS_DIR
from hpc_rollout.handlers.harness_task import HarnessHandler, HarnessSettings
from orchestrator.agent.loop import AgentLimits
from orchestrator.agent.tool_handler import ToolAgentHandler
from orchestrator.handler_api.reward_rule import RewardRule
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext

ROLLOUT_FILE = Path(__file__).with_name("verifiers_rollout.py")
VENV_INSIDE = "/verifiers"
TASKSET_INSIDE = "/verifiers-taskset"
RUNNER_INSIDE = f"{HARNESS_DIR}/verifiers_rollout.py"
SPEC_INSIDE = f"{HARNESS_DIR}/verifiers_spec.json"
LIMITS = AgentLimits(max_turns=30, max_context_tokens=16384, max_wall_s=1800)

VERIFIERS_KEYS = InstanceSchema((
        instance_key("taskset", Kind.STRING, "the taskset id verifiers imports", required=True),
        instance_key("venv", Kind.STRING, "a virtualenv with verifiers (of the image's python3)", required=True),
        instance_key("path", Kind.STRING, "a folder holding the taskset, put on sys.path"),
        instance_key("index", Kind.INTEGER, "the task's position in the taskset (default 0)"),
        instance_key("harness", Kind.STRING, "a verifiers harness id (default: the taskset's)"),
        instance_key("taskset_options", Kind.OBJECT, "the taskset's config fields"),
        instance_key("harness_options", Kind.OBJECT, "the harness's config fields"),
        instance_key("model_name", Kind.STRING, "the model id verifiers asks for (default policy)"),
        instance_key("max_calls", Kind.INTEGER, "LLM calls at most"),
        instance_key("max_wall_s", Kind.NUMBER, "seconds the rollout may take"),
))
SCHEMA = InstanceSchema((instance_key("verifiers", Kind.OBJECT, "the taskset, task and harness verifiers runs",
                                      required=True, keys=VERIFIERS_KEYS),))

RULE = RewardRule(
    summary="the taskset's own @vf.reward functions, run by verifiers in the sandbox",
    graded="the verifiers trace of the rollout (its replies, and what the harness left in the sandbox)",
    against="whatever the taskset's reward functions compare with (its task data)",
    range="the taskset's: the weighted sum of its rewards",
    truncated="the taskset's reward functions see the cut reply as any other",
    failed="no reward (null, status `failed`): a rollout that erred before scoring, or wrote no reward",
    ground_truth="the taskset's own task data, inside the sandbox")


@dataclass(frozen=True)
class VerifiersTask:
    taskset: str
    venv: str
    path: str = ""
    index: int = 0
    harness: str = ""
    taskset_options: dict[str, Any] = field(default_factory=dict)
    harness_options: dict[str, Any] = field(default_factory=dict)
    model_name: str = "policy"
    max_calls: int = LIMITS.max_turns
    max_wall_s: float = LIMITS.max_wall_s

    @classmethod
    def parse(cls, instance: dict[str, Any]) -> "VerifiersTask":
        given = instance.get("verifiers")
        if not isinstance(given, dict) or not isinstance(given.get("taskset"), str) or not given["taskset"]:
            raise ValueError('a verifiers task needs {"verifiers": {"taskset": ID, "venv": PATH, ...}}')
        if not isinstance(given.get("venv"), str) or not Path(given["venv"]).is_absolute():
            raise ValueError("verifiers.venv must be the absolute path of a virtualenv with verifiers")
        if given.get("path") and not Path(str(given["path"])).is_absolute():
            raise ValueError("verifiers.path must be an absolute path")
        for name in ("taskset_options", "harness_options"):
            if not isinstance(given.get(name, {}), dict):
                raise ValueError(f"verifiers.{name} must be an object")
        index, calls, wall = given.get("index", 0), given.get("max_calls", LIMITS.max_turns), given.get("max_wall_s", LIMITS.max_wall_s)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"verifiers.index must be a task position >= 0, got {index!r}")
        if isinstance(calls, bool) or not isinstance(calls, int) or not 1 <= calls <= 10_000:
            raise ValueError(f"verifiers.max_calls must be in [1, 10000], got {calls!r}")
        if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall) or not 1 <= wall <= 7 * 86400:
            raise ValueError(f"verifiers.max_wall_s must be in [1, 604800], got {wall!r}")
        return cls(given["taskset"], given["venv"], str(given.get("path") or ""), index, str(given.get("harness") or ""),
                   dict(given.get("taskset_options") or {}), dict(given.get("harness_options") or {}),
                   str(given.get("model_name") or "policy"), calls, float(wall))

    def spec(self) -> dict[str, Any]:
        """What verifiers_rollout.py reads in the sandbox."""
        return {"taskset": self.taskset, "path": TASKSET_INSIDE if self.path else "", "index": self.index,
                "harness": self.harness, "taskset_options": self.taskset_options,
                "harness_options": self.harness_options, "model": self.model_name}

    def binds(self) -> tuple[str, ...]:
        return (f"{self.venv}:{VENV_INSIDE}:ro", *((f"{self.path}:{TASKSET_INSIDE}:ro",) if self.path else ()))

    def settings(self) -> HarnessSettings:
        command = (f"{VENV_INSIDE}/bin/python {shlex.quote(RUNNER_INSIDE)} {shlex.quote(SPEC_INSIDE)} "
                   '"$HPC_ROLLOUT_REWARD_FILE"')
        # verifiers keeps its scripts and runtimes under ~/.cache: a home in the workspace.
        return HarnessSettings(command=command, family="verifiers", model_name=self.model_name, max_calls=self.max_calls,
                               max_context_tokens=LIMITS.max_context_tokens, max_wall_s=self.max_wall_s,
                               env={"HOME": f"{HARNESS_DIR}/home"}, binds=self.binds(), reward=RewardSource.REPORTED,
                               reward_range=(-math.inf, math.inf))


class VerifiersWorkspace(ToolAgentHandler):
    """The family `harness` needs: an empty workspace in the image, nothing to collect."""

    name: ClassVar[str] = "verifiers-workspace"
    limits: ClassVar[AgentLimits] = LIMITS

    def task(self, instance: dict[str, Any]) -> VerifiersTask:
        return VerifiersTask.parse(instance)

    def messages(self, task: VerifiersTask) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"verifiers taskset {task.taskset}, task {task.index}"}]

    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        return {"reward": reported_reward(result)}   # what verifiers computed in the sandbox


class VerifiersHandler(HarnessHandler):
    name: ClassVar[str] = "verifiers"
    instance_schema = SCHEMA
    reward_rule = RULE

    def family(self, instance: dict[str, Any]) -> tuple[HarnessSettings, ToolAgentHandler]:
        return VerifiersTask.parse(instance).settings(), VerifiersWorkspace()

    def ignored_reward_model(self, instance: dict[str, Any]) -> str | None:
        if instance.get("reward_model") is None:
            return None
        return "a verifiers task is scored by its taskset's reward functions, not reward_model"

    async def init(self, ctx: "JobContext") -> dict[str, Any]:
        prepared = await super().init(ctx)
        sandbox = await ctx.sandbox()
        task = VerifiersTask.parse(ctx.job.instance)
        for data, path in ((ROLLOUT_FILE.read_bytes(), RUNNER_INSIDE), (json.dumps(task.spec()).encode(), SPEC_INSIDE)):
            written = await sandbox.upload(data, path)
            if written.error:
                raise RuntimeError(f"writing {path} in the sandbox: {written.error}")
        ctx.event("verifiers_prepared", taskset=task.taskset, index=task.index, harness=task.harness or "default")
        return prepared

    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        out = await super().eval(ctx, result)
        return {**out, "reward_source": "verifiers"}
