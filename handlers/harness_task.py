"""`harness`: train an agent whose loop you do not own (any CLI that calls an OpenAI or Anthropic API).

    hpc-rollout submit spool/run1 swe.jsonl --handler harness --samples 8
    # each row: a swe/code/math task + {"harness": {"command": "mini -m openai/policy -t \"$(cat $HPC_ROLLOUT_TASK_FILE)\" ..."}}
    # or a CLI known by name: {"harness": {"cli": "claude-code"}} / {"harness": {"cli": "codex"}}

INIT starts the job's sandbox the way the task's family does (swe: the repository checked out;
code, math: an empty workspace) and writes the task's text to /workspace/.harness/task.md. RUN
makes the job's proxy directory in the sandbox's own control directory (orchestrator/proxy/
placement.py: it goes with the sandbox, whatever ends the job), starts the proxy on its socket
and runs `harness.command` in the sandbox through the relay, so the command sees OPENAI_BASE_URL
and OPENAI_API_KEY (and ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY) of its job's proxy; time and call
limits stop it. A CLI known by name (harness_clis.py: claude-code, codex) brings its command
line, environment and configuration files (written in INIT). The row is built from the
recorded calls by the chosen trajectory builder. EVAL is the family's own (swe: FAIL_TO_PASS/PASS_TO_PASS in a fresh
sandbox; code: hidden tests on /workspace/solution.py; math: the last reply's answer).

`harness` settings (in the row, or for every row with `submit --set harness.KEY=VALUE`):
    command (required unless cli is given), cli (claude-code | codex), family (swe | code | math;
    inferred from the row when absent),
    builder (prefix_merging | per_request), parser (tool-call parser), model_name (what
    /v1/models names the policy), max_calls, max_context_tokens, max_tokens_per_call,
    max_wall_s, env (extra environment for the command), binds (SRC:DST[:ro|rw] into the sandbox,
    e.g. a harness installed on the shared filesystem; the source must lie inside a directory the
    run allows: run.toml [sandbox] allowed_binds, or allowed_rw_binds for :rw), reward (family |
    reported: the reward the harness writes to $HPC_ROLLOUT_REWARD_FILE, handlers/harness_reward.py)
    and reward_range.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar

from hpc_rollout.handlers.code_task import CodeHandler
from hpc_rollout.handlers.harness_clis import CliPreset, CliSettings, preset
from hpc_rollout.handlers.harness_reward import (
    REWARD_FILE, RewardSource, parse_reward_range, read_report, reported_reward,
)
from hpc_rollout.handlers.math_task import MathHandler
from hpc_rollout.handlers.swe_task import SweHandler
from hpc_rollout.handlers.task_rows import flatten
from orchestrator.agent.tool_handler import DEFAULT_PARSER, KINDS, ToolAgentHandler
from orchestrator.agent.parsers import get_parser
from orchestrator.handler_api.reward_rule import RewardRule
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key
from orchestrator.settings_spec import SPEC, Declared, Family, Numbers, checked, declarations, setting
from orchestrator.spool.jobs import StageError
from orchestrator.proxy.trajectory import Builder, trajectory_fields

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext
    from orchestrator.proxy.recorder import CallRecorder

TASK_FILE = "/workspace/.harness/task.md"
LOG_FILE = "/workspace/.harness/harness.log"
LOG_TAIL_CHARS = 4000
FAMILIES: dict[str, type[ToolAgentHandler]] = {"swe": SweHandler, "code": CodeHandler, "math": MathHandler}


# A whole number's field keeps int(value) of any int or float, never a bool: what the harness always took.
HARNESS = Family("harness setting", "harness {key}", numbers=Numbers.TRUNCATE, show_help=True)


@dataclass(frozen=True)
class HarnessSettings:
    command: str = setting("", "the harness's shell command, run in the sandbox")   # "" with a cli: the preset's
    # Checked below, naming the families (absent or empty: the row's); verifiers_task.py adds its own.
    family: str = setting("", f"task family whose INIT and EVAL are used: {', '.join(FAMILIES)} (default: from the row)",
                          kind=object)
    cli: str = setting("", "a CLI known by name (harness_clis.py), instead of a command")
    builder: Builder = setting(Builder.PREFIX_MERGING, "how rows are built from the calls: prefix_merging | per_request")
    parser: str = setting(DEFAULT_PARSER, "tool-call parser of the policy's replies")
    # Any value, read as text (what the harness always took).
    model_name: str = setting("policy", "the model id /v1/models names", kind=object)
    # Unset in a row: the family's agent limits (max_turns, max_context_tokens, ...).
    max_calls: int = setting(30, "LLM calls at most", bounds=(1, 10_000))
    max_context_tokens: int = setting(16384, "prompt + reply tokens per call at most", bounds=(16, 10_000_000))
    max_tokens_per_call: int = setting(1024, "tokens sampled per call at most", bounds=(1, 1_000_000))
    max_wall_s: float = setting(1800.0, "seconds the command may run", bounds=(1, 7 * 86400))
    env: dict[str, str] = field(default_factory=dict, metadata={SPEC: Declared(
        "extra environment variables for the command", kind=object)})
    binds: tuple[str, ...] = setting((), "SRC:DST[:ro|rw] mounts into the sandbox", kind=object)
    reward: RewardSource = setting(RewardSource.FAMILY, "family (the task family's grading) | reported (what the "
                                   "harness writes to $HPC_ROLLOUT_REWARD_FILE)")
    reward_range: tuple[float, float] = setting((0.0, 1.0), "[low, high] a reported reward must lie in", kind=object)

    @classmethod
    def parse(cls, instance: dict[str, Any]) -> "HarnessSettings":
        given = instance.get("harness")
        if not isinstance(given, dict):
            given = {}
        command = given.get("command", "")
        if not isinstance(command, str) or not (command.strip() or given.get("cli")):
            raise ValueError('a harness task needs {"harness": {"command": "..."}} or {"harness": {"cli": NAME}} '
                             '(or submit --set harness.command=... / --set harness.cli=claude-code)')
        if "cli" in given:
            preset(str(given["cli"]))
        values = checked(cls, given, HARNESS)
        family = given.get("family") or infer_family(instance)
        if family not in FAMILIES:
            raise ValueError(f"harness family {family!r}: choose one of {', '.join(FAMILIES)}")
        limits = FAMILIES[family].limits
        defaults = {"max_calls": limits.max_turns, "max_context_tokens": limits.max_context_tokens,
                    "max_tokens_per_call": limits.max_tokens_per_turn, "max_wall_s": limits.max_wall_s}
        values = {**defaults, **values, "command": command, "family": family, "cli": str(given.get("cli") or "")}
        if "parser" in given:
            get_parser(values["parser"])
        if "model_name" in given:
            values["model_name"] = str(given["model_name"])
        env = given.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and k.isidentifier() for k in env):
            raise ValueError("harness env must be an object of NAME: value")
        values["env"] = {k: str(v) for k, v in env.items()}
        binds = given.get("binds") or []
        if not isinstance(binds, list) or not all(isinstance(b, str) and ":" in b for b in binds):
            raise ValueError('harness binds must be a list of "SRC:DST[:ro|rw]" strings')
        values["binds"] = tuple(binds)
        if "reward_range" in given:
            values["reward_range"] = parse_reward_range(given["reward_range"])
        return cls(**values)

    @property
    def preset(self) -> CliPreset | None:
        return preset(self.cli) if self.cli else None

    def cli_settings(self) -> CliSettings:
        return CliSettings(self.model_name, self.max_calls, self.max_context_tokens, self.max_tokens_per_call)

    def command_line(self) -> str:
        """The command to run: the given one, else the CLI preset's."""
        chosen = self.preset
        return self.command if self.command.strip() or chosen is None else chosen.command(self.cli_settings())

    def environment(self) -> dict[str, str]:
        """The command's extra environment: the CLI preset's, then `env` (which wins)."""
        chosen = self.preset
        return {**(chosen.env(self.cli_settings()) if chosen else {}), **self.env}

    def files(self) -> dict[str, str]:
        """Configuration files the CLI preset needs in the sandbox (path -> text)."""
        chosen = self.preset
        return chosen.files(self.cli_settings()) if chosen else {}


_SETTING_KINDS = {"env": Kind.OBJECT, "binds": Kind.LIST, "reward_range": Kind.LIST}   # read by parse
# The harness settings as the dataclass has them (a new setting is a new key here, with no second list).
SETTINGS = InstanceSchema(tuple(
    instance_key(name, _SETTING_KINDS.get(name, KINDS.get(spec.kind, Kind.STRING)),
        spec.help)   # command or cli: validate_instance says which
    for name, spec in declarations(HarnessSettings).items()))
# The row of its family (swe, code or math) plus the harness settings.
# `harness` is checked by validate_instance, whose message names both ways to give it (command or cli).
SCHEMA = InstanceSchema((instance_key("harness", Kind.OBJECT, "how to run the harness (or submit --set harness.KEY=VALUE)",
                             keys=SETTINGS),), accepts_verl_rows=True).merged(
    *(family.instance_schema for family in FAMILIES.values() if family.instance_schema is not None))


RULE = RewardRule(
    summary="the task family's rule (math, code, swe) on what the harness left; or, with harness.reward = reported, "
            "the number it wrote",
    graded="`harness.reward = family` (default): the family's rule on what the harness left in its sandbox: the "
           "last reply's `\\boxed{}` (math), `/workspace/solution.py` (code), the repository's diff (swe); `reported`: "
           "the number the harness wrote to `$HPC_ROLLOUT_REWARD_FILE`",
    against="family: the row's answer, hidden tests, or FAIL_TO_PASS / PASS_TO_PASS, as the family does; reported: "
            "nothing (the policy's commands run as the same user in the same sandbox and can write that file too: "
            "use it only for a harness that scores outside their reach)",
    range="the family's; reported: `harness.reward_range` (default [0, 1])",
    truncated="the family's rule (the harness decides when a cut reply ends its loop)",
    failed="no reward (null, status `failed`); reported: a missing report, or one that is not a number in range, "
           "fails the job",
    ground_truth="the family's (math, code); not used with harness.reward = reported, nor by swe")


def infer_family(instance: dict[str, Any]) -> str:
    fields_ = flatten(instance)
    if "base_commit" in fields_:
        return "swe"
    if "tests" in fields_:
        return "code"
    if any(k in fields_ for k in ("answer", "ground_truth")):
        return "math"
    raise ValueError("cannot tell the task family of this row: set harness.family to one of "
                     + ", ".join(FAMILIES))


def task_text(messages: list[dict[str, Any]]) -> str:
    """What the harness is asked to do: the task's user message(s)."""
    return "\n\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")


def harness_script(settings: HarnessSettings, proxy_dir: str) -> str:
    """The command through the relay; `proxy_dir`: the job's proxy directory as the sandbox sees it."""
    exports = "".join(f"export {name}={shlex.quote(value)}; " for name, value in sorted(settings.environment().items()))
    relay = shlex.quote(f"{proxy_dir}/relay.py")
    return (f"mkdir -p {shlex.quote(str(Path(LOG_FILE).parent))} && export HPC_ROLLOUT_TASK_FILE={TASK_FILE}; "
            f"export HPC_ROLLOUT_REWARD_FILE={REWARD_FILE}; {exports}"
            f"python3 -I {relay} --dir {shlex.quote(proxy_dir)} -- bash -c {shlex.quote(settings.command_line())} "
            f"> {LOG_FILE} 2>&1")


class HarnessHandler(ToolAgentHandler):
    name: ClassVar[str] = "harness"
    instance_schema = SCHEMA
    reward_rule = RULE

    def __init__(self) -> None:
        super().__init__()
        self._recorders: dict[str, "CallRecorder"] = {}
        self._logs: dict[str, dict[str, Any]] = {}    # the command's end, for the row of a failed RUN

    def family(self, instance: dict[str, Any]) -> tuple[HarnessSettings, ToolAgentHandler]:
        settings = HarnessSettings.parse(instance)
        return settings, FAMILIES[settings.family]()

    def validate_instance(self, instance: dict[str, Any]) -> None:
        _, family = self.family(instance)
        family.messages(family.task(instance))

    def ignored_reward_model(self, instance: dict[str, Any]) -> str | None:
        if instance.get("reward_model") is None:
            return None
        try:
            settings, family = self.family(instance)
        except ValueError:
            return None   # validate_instance says what is wrong with the row
        if settings.reward is RewardSource.REPORTED:
            return "harness.reward = reported does not use reward_model (the harness reports the reward)"
        return family.ignored_reward_model(instance)

    def sandbox_request(self, instance: dict[str, Any]) -> dict[str, Any]:
        """The most any sandbox of the job asks for: the family's, with the row's binds (each must be
        allowed by run.toml [sandbox])."""
        settings, family = self.family(instance)
        return self._with_binds(family.sandbox_request(instance), settings)

    def _with_binds(self, options: dict[str, Any], settings: HarnessSettings) -> dict[str, Any]:
        if settings.binds:
            options = {**options, "binds": [*options.get("binds", []), *settings.binds]}
        return options

    async def init(self, ctx: "JobContext") -> dict[str, Any]:
        settings, family = self.family(ctx.job.instance)
        task = family.task(ctx.job.instance)
        # The agent's sandbox is the family's own (swe: no mirror in it), with the row's binds.
        sandbox = await ctx.open_sandbox(**self._with_binds(family.sandbox_options(task), settings))
        prepared = await family.setup(ctx, sandbox, task)
        await sandbox.upload(task_text(family.messages(task)).encode(), TASK_FILE)
        for path, text in settings.files().items():
            written = await sandbox.upload(text.encode(), path)
            if written.error:
                raise RuntimeError(f"writing the {settings.cli} configuration {path} in the sandbox: {written.error}")
        ctx.event("harness_prepared", family=settings.family, **({"cli": settings.cli} if settings.cli else {}))
        return {"sandbox_kind": sandbox.kind, **prepared}

    async def run(self, ctx: "JobContext", prepared: dict[str, Any]) -> dict[str, Any]:
        from orchestrator.llm.session import session_for
        from orchestrator.proxy.placement import proxy_dir_in
        from orchestrator.proxy.recorder import CallRecorder, ProxyLimits
        from orchestrator.proxy.server import JobProxy

        instance = ctx.job.instance
        settings, family = self.family(instance)
        task = family.task(instance)
        sandbox = await ctx.sandbox()
        sampling = {**ctx.job.sampling, **(instance.get("sampling") or {})}
        budgets = ctx.services.proxy   # run.toml [proxy]
        limits = ProxyLimits(settings.max_calls, settings.max_context_tokens, settings.max_tokens_per_call,
                             budgets.max_chars_per_token)

        def note(record: dict[str, Any]) -> None:
            ctx.event("llm_call", call=len(recorder.calls), chain=record["chain"], extended=record["extended"],
                      api=record["api"], prompt_tokens=len(record["input_ids"]), sampled=len(record["output_ids"]),
                      **({"cancelled": True} if record.get("cancelled") else {}),
                      **({"diverged": record["diverged"]} if record["diverged"] else {}))

        proxy_dir, inside_dir = proxy_dir_in(sandbox)
        try:
            async with session_for(ctx) as llm:
                recorder = CallRecorder(llm, await llm.tokenizer(), get_parser(settings.parser), sampling, limits, note)
                self._recorders[ctx.job.job_id] = recorder
                async with JobProxy(recorder, proxy_dir, model_name=settings.model_name,
                                    max_body_bytes=budgets.max_body_bytes):
                    outcome = await self._run_command(sandbox, harness_script(settings, inside_dir), settings, recorder)
        finally:
            shutil.rmtree(proxy_dir, ignore_errors=True)
        if recorder.failed_with is not None:
            # The backend failed for good (or the policy went stale): the job ends as any handler's
            # would with that error, its row keeping the calls made so far and the command's log.
            self._logs[ctx.job.job_id] = {"harness_exit_code": outcome.exit_code, "harness_log": await self._log_tail(sandbox)}
            raise recorder.failed_with
        last_chain = recorder.chains[recorder.calls[-1]["chain"]].conversation if recorder.calls else None
        stand_in = SimpleNamespace(conversation=last_chain or SimpleNamespace(messages=[]))
        artifacts = await family.collect(ctx, sandbox, stand_in, task)  # type: ignore[arg-type]
        self._recorders.pop(ctx.job.job_id, None)
        stop_reason = (recorder.stop_reason or ("timeout" if outcome.timed_out else None)
                       or ("finished" if outcome.exit_code == 0 else "error"))
        ctx.event("harness_stopped", reason=stop_reason, exit_code=outcome.exit_code, calls=len(recorder.calls),
                  chains=len(recorder.chains))
        log_tail = await self._log_tail(sandbox)
        report = await read_report(sandbox, *settings.reward_range)
        return {**self._trajectory(recorder, settings), **artifacts, **report, "stop_reason": stop_reason,
                "harness_exit_code": outcome.exit_code, "harness_log": log_tail}

    async def _run_command(self, sandbox: Any, script: str, settings: HarnessSettings, recorder: "CallRecorder") -> Any:
        """The command through the relay; a reached limit (or a dead backend) interrupts it."""
        command = asyncio.ensure_future(sandbox.bash(script, timeout=settings.max_wall_s))
        stopped = asyncio.ensure_future(recorder.stopped.wait())
        try:
            await asyncio.wait({command, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not command.done():
                await sandbox.interrupt("bash")
            return await command
        finally:
            stopped.cancel()
            if not command.done():
                command.cancel()

    async def _log_tail(self, sandbox: Any) -> str:
        fetched = await sandbox.download(LOG_FILE)
        if fetched.error or fetched.content is None:
            return ""
        return fetched.content[-LOG_TAIL_CHARS:].decode("utf-8", "replace")

    def _trajectory(self, recorder: "CallRecorder", settings: HarnessSettings) -> dict[str, Any]:
        calls = recorder.calls
        versions = [c["policy_version"] for c in calls if c.get("policy_version") is not None]
        out = {**trajectory_fields(calls, settings.builder), "turns": calls, "malformed_calls": recorder.malformed_calls,
               "calls": len(calls), "chains": len(recorder.chains), "refused_calls": recorder.refused,
               "cancelled_calls": sum(1 for c in calls if c.get("cancelled")),
               "apis": sorted({c["api"] for c in calls if c.get("api")}),
               "unserved_endpoints": list(recorder.unserved), "final_text": recorder.final_text(), "answer": None}
        if settings.cli:
            out["cli"] = settings.cli
        if versions:
            out["policy_version_min"], out["policy_version_max"] = min(versions), max(versions)
        return out

    def run_exception(self, ctx: "JobContext", error: StageError) -> dict[str, Any]:
        recorder = self._recorders.pop(ctx.job.job_id, None)
        partial: dict[str, Any] = self._logs.pop(ctx.job.job_id, {})
        if recorder is not None:
            try:
                partial.update(self._trajectory(recorder, self.family(ctx.job.instance)[0]))
            except ValueError:
                pass
        reason = {"timeout": "timeout", "cancelled": "cancelled"}.get(error.kind, "error")
        return {**partial, "stop_reason": reason, "error": error.as_text()}

    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        settings, family = self.family(ctx.job.instance)
        if settings.reward is RewardSource.REPORTED:
            return {"reward": reported_reward(result), "reward_source": RewardSource.REPORTED.value}
        return await family.eval(ctx, result)
