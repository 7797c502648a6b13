"""ToolAgentHandler: the AgentHandler of every tool-using task family (and of yours).

INIT opens the job's sandbox and calls `setup`; RUN renders the task's messages with the tools
through the tokenizer's chat template, runs the agent loop against the job's LLM session and
the sandbox, then calls `collect` (while the sandbox is still open) for the artifacts EVAL
needs; EVAL is the family's own. A subclass sets `tools`, `limits` and implements `task`,
`messages` and `eval`:

    class MyHandler(ToolAgentHandler):
        name = "mine"
        tools = ("bash", "str_replace_editor", "finish")
        def task(self, instance): ...                    # validate, normalise
        def messages(self, task): ...                    # the first prompt
        async def eval(self, ctx, result): ...           # {"reward": ...}

Per task, an "agent" object overrides the limits (max_turns, max_context_tokens, max_wall_s,
tool_timeout_s, max_tokens_per_turn, max_observation_chars, text_reply), "parser" picks the
tool-call parser and "context" the context policy (agent/context.py: drop or summarize old turns
past a token budget; `summarize_tool` adds the summarize tool). A family may give a process
reward per tool result by overriding `tool_reward` (it lands in the row's `turn_rewards`).
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.agent.context import ContextPolicy
from orchestrator.agent.loop import AgentLimits, AgentRun, StopReason, ToolCallRecord, run_agent
from orchestrator.agent.parsers import PARSERS, get_parser
from orchestrator.agent.toolbox import SandboxToolbox, ToolOutcome
from orchestrator.agent.tools import ToolSpec, openai_tools, tool_specs
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.handler_api.schema import InstanceSchema, Key, Kind, instance_key
from orchestrator.settings_spec import declarations
from orchestrator.spool.jobs import StageError

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext
    from orchestrator.sandbox.base import Sandbox

DEFAULT_PARSER = "hermes"
RENDER_WINDOW = 2   # observations are rendered after the last 2 messages (checked: Conversation.window)

KINDS = {int: Kind.INTEGER, float: Kind.NUMBER, bool: Kind.BOOLEAN}   # any other (text, an enum): a string


def declared_keys(cls: type) -> InstanceSchema:
    """The instance keys of a dataclass's declared settings: each its kind and its help (with the choices)."""
    return InstanceSchema(tuple(
        instance_key(name, KINDS.get(spec.kind, Kind.STRING),
                     f"{spec.help}: {', '.join(spec.choices)}" if spec.choices else spec.help)
        for name, spec in declarations(cls).items()))


AGENT_LIMITS = declared_keys(AgentLimits)
CONTEXT_KEYS = declared_keys(ContextPolicy)


def agent_task_keys(limits: AgentLimits) -> tuple[Key, ...]:
    """The keys every tool-using family's instances take besides their task's own."""
    return (
        instance_key("agent", Kind.OBJECT, f"overrides of the agent loop's limits (defaults: {limits.max_turns} turns, "
            f"{limits.max_context_tokens} context tokens, {limits.max_wall_s:g} s)", keys=AGENT_LIMITS),
        instance_key("parser", Kind.STRING, f"tool-call parser: {', '.join(sorted(PARSERS))}", default=DEFAULT_PARSER),
        instance_key("sampling", Kind.OBJECT, "sampling parameters for this task (over submit --sampling)"),
        instance_key("image", (Kind.STRING, Kind.NULL), "sandbox image (default: run.toml [sandbox] image)"),
        instance_key("context", Kind.OBJECT, "context policy past a token budget (agent/context.py; default: none)",
                     keys=CONTEXT_KEYS),
    )


class ToolAgentHandler(AgentHandler):
    tools: ClassVar[tuple[str, ...]] = ("bash", "python", "str_replace_editor", "think", "finish")
    limits: ClassVar[AgentLimits] = AgentLimits()
    context: ClassVar[ContextPolicy] = ContextPolicy()

    def __init__(self) -> None:
        self._live: dict[str, AgentRun] = {}   # runs in progress, for run_exception

    # -- what a family provides ---------------------------------------------------------------
    def task(self, instance: dict[str, Any]) -> Any:
        """The normalised task; raise ValueError naming the problem."""
        raise NotImplementedError

    def messages(self, task: Any) -> list[dict[str, Any]]:
        """The conversation the agent starts from."""
        raise NotImplementedError

    def sandbox_options(self, task: Any) -> dict[str, Any]:
        image = getattr(task, "image", None)
        return {"image": image} if image else {}

    def sandbox_request(self, instance: dict[str, Any]) -> dict[str, Any]:
        return self.sandbox_options(self.task(instance))

    async def setup(self, ctx: "JobContext", sandbox: "Sandbox", task: Any) -> dict[str, Any]:
        """Prepare the workspace in INIT (e.g. check out a repository)."""
        return {}

    async def collect(self, ctx: "JobContext", sandbox: "Sandbox", run: AgentRun, task: Any) -> dict[str, Any]:
        """Artifacts for EVAL, read from the sandbox before it closes."""
        return {}

    def tool_reward(self, task: Any, record: ToolCallRecord, outcome: ToolOutcome) -> float | None:
        """A process reward for one tool result (None: none), added to the turn that made the call."""
        return None

    def reference_result(self, task: Any, which: str) -> dict[str, Any]:
        """A RUN result EVAL can score: `golden` (must get 1) or `noop` (must get 0); for `tasks check`."""
        raise NotImplementedError(f"handler {self.name!r} has no golden/no-op solutions for `tasks check`")

    # -- the stages --------------------------------------------------------------------------
    def validate_instance(self, instance: dict[str, Any]) -> None:
        task = self.task(instance)
        AgentLimits.parse(self.limits, instance.get("agent"))
        ContextPolicy.parse(self.context, instance.get("context"))
        get_parser(str(instance.get("parser", DEFAULT_PARSER)))
        tool_specs(self.tools)
        self.messages(task)

    def specs(self, context: ContextPolicy | None = None) -> tuple[ToolSpec, ...]:
        names = self.tools
        if context is not None and context.summarize_tool and "summarize" not in names:
            names = (*names, "summarize")
        return tool_specs(names)

    async def init(self, ctx: "JobContext") -> dict[str, Any]:
        task = self.task(ctx.job.instance)
        sandbox = await ctx.open_sandbox(**self.sandbox_options(task))
        if "python" in self.tools:   # its interpreter boots during setup and the first LLM turn, not at the first call
            await sandbox.warm(("python",))
        return {"sandbox_kind": sandbox.kind, **await self.setup(ctx, sandbox, task)}

    async def run(self, ctx: "JobContext", prepared: dict[str, Any]) -> dict[str, Any]:
        from orchestrator.llm.conversation import Conversation
        from orchestrator.llm.session import session_for

        instance = ctx.job.instance
        task = self.task(instance)
        limits = AgentLimits.parse(self.limits, instance.get("agent"))
        context = ContextPolicy.parse(self.context, instance.get("context"))
        parse = get_parser(str(instance.get("parser", DEFAULT_PARSER)))
        specs = self.specs(context)
        sampling = {**ctx.job.sampling, **(instance.get("sampling") or {})}
        sandbox = await ctx.sandbox()
        toolbox = SandboxToolbox(sandbox, specs, limits.max_observation_chars)

        def note(record: ToolCallRecord) -> None:
            ctx.event("tool_call", turn=record.turn, tool=record.name, exit_code=record.exit_code,
                      ms=record.latency_ms, chars=record.output_chars, error=record.error)

        async with session_for(ctx) as llm:
            conversation = Conversation(await llm.tokenizer(), self.messages(task), tools=openai_tools(specs),
                                        window=RENDER_WINDOW)
            run = self._live[ctx.job.job_id] = AgentRun(conversation)
            await run_agent(llm, run, toolbox, parse=parse, limits=limits, sampling=sampling, on_tool_call=note,
                            context=context, tool_reward=lambda record, outcome: self.tool_reward(task, record, outcome))
            failed = list(llm.failed)
        artifacts = await self.collect(ctx, sandbox, run, task)
        self._live.pop(ctx.job.job_id, None)
        ctx.event("agent_stopped", reason=run.stop_reason.value if run.stop_reason else None,
                  turns=len(run.turns), tool_calls=len(run.tool_calls), malformed=run.malformed_calls)
        return {**run.to_json(), **artifacts, "backend_switches": failed}

    def run_exception(self, ctx: "JobContext", error: StageError) -> dict[str, Any]:
        """Keep what the run did before it failed, with the stop reason the failure means."""
        run = self._live.pop(ctx.job.job_id, None)
        reason = {"timeout": StopReason.TIMEOUT, "cancelled": StopReason.CANCELLED}.get(error.kind, StopReason.ERROR)
        partial: dict[str, Any] = run.to_json() if run is not None else {}
        return {**partial, "stop_reason": reason.value, "error": error.as_text()}

    def final_result(self, ctx: "JobContext", outputs: dict[str, dict[str, Any]],
                     error: StageError | None) -> dict[str, Any]:
        merged = super().final_result(ctx, outputs, error)
        if "stop_reason" not in merged:   # the job ended before RUN (INIT failed, cancelled early)
            merged["stop_reason"] = (StopReason.CANCELLED if error and error.kind == "cancelled"
                                     else StopReason.TIMEOUT if error and error.kind == "timeout"
                                     else StopReason.ERROR).value
        return merged


@asynccontextmanager
async def fresh_sandbox(ctx: "JobContext", **options: Any) -> AsyncIterator["Sandbox"]:
    """A sandbox of its own for EVAL (the RUN sandbox is closed by then), with a workspace of
    its own that is removed afterwards: grading never sees what the agent left lying around."""
    from orchestrator.sandbox.start import start_sandbox

    workspace = ctx.artifact_dir() / f"eval-{ctx.attempt}-{secrets.token_hex(3)}"
    merged = ctx.sandbox_options({**options, "workspace": str(workspace)})   # refused before anything is made
    workspace.mkdir(parents=True)
    try:
        sandbox = await start_sandbox(ctx.services.runtime, job_id=ctx.job.job_id, paths=ctx.paths, **merged)
        try:
            yield sandbox
        finally:
            await sandbox.close()
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
