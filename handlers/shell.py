"""`shell`: run a list of shell commands in the job's sandbox; reward 1 if `expect` shows up.

Instance (SCHEMA below): {"commands": ["echo hi > out.txt", "cat out.txt"], "expect": "hi",
                          "image": null, "network": false, "timeout": 60}
"image" and "network" are the row's choices among what the run allows (run.toml [sandbox]
allowed_images, network_handlers); anything else is refused at submit and before INIT.
INIT opens the sandbox, RUN executes the commands with the bash tool, EVAL scores from the
RUN output alone (the sandbox is closed before EVAL, which may run on another node).
"""

from __future__ import annotations

from typing import Any

from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key

SCHEMA = InstanceSchema((
    instance_key("commands", Kind.LIST, "shell lines run one after another in the sandbox's bash", required=True),
    instance_key("expect", Kind.STRING, "reward 1 when the output contains it (absent: when every command exits 0)"),
    instance_key("image", (Kind.STRING, Kind.NULL), "sandbox image (default: run.toml [sandbox] image)"),
    instance_key("network", Kind.BOOLEAN, "network access in the sandbox", default=False),
    instance_key("timeout", Kind.NUMBER, "seconds per command, in (0, 86400]", default=60),
))


class ShellHandler(AgentHandler):
    name = "shell"
    instance_schema = SCHEMA

    def validate_instance(self, instance: dict[str, Any]) -> None:
        commands = instance.get("commands")
        if not isinstance(commands, list) or not commands or not all(isinstance(c, str) for c in commands):
            raise ValueError('shell instances need "commands": a non-empty list of strings')
        if "expect" in instance and not isinstance(instance["expect"], str):
            raise ValueError('"expect" must be a string')
        timeout = SCHEMA.value(instance, "timeout")
        if not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
            raise ValueError('"timeout" must be a number of seconds in (0, 86400]')

    def sandbox_request(self, instance: dict[str, Any]) -> dict[str, Any]:
        """The row's image and network: choices among what run.toml [sandbox] allows."""
        options: dict[str, Any] = {"network": bool(SCHEMA.value(instance, "network"))}
        if instance.get("image"):
            options["image"] = str(instance["image"])
        return options

    async def init(self, ctx: JobContext) -> dict[str, Any]:
        sandbox = await ctx.open_sandbox(**self.sandbox_request(ctx.job.instance))
        return {"sandbox_kind": sandbox.kind}

    async def run(self, ctx: JobContext, prepared: dict[str, Any]) -> dict[str, Any]:
        instance = ctx.job.instance
        sandbox = await ctx.sandbox()
        timeout = float(SCHEMA.value(instance, "timeout"))
        steps = []
        for command in instance["commands"]:
            result = await sandbox.bash(command, timeout=timeout)
            steps.append({
                "command": command, "output": result.output, "exit_code": result.exit_code,
                "timed_out": result.timed_out, "limit": result.limit, "error": result.error,
            })
            ctx.event("shell_command", exit_code=result.exit_code, timed_out=result.timed_out)
        return {"steps": steps, "output": "".join(step["output"] for step in steps)}

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        expect = ctx.job.instance.get("expect")
        output = result.get("output") or ""
        if expect is None:  # no expectation: success means every command exited 0
            ok = all(step.get("exit_code") == 0 for step in result.get("steps") or [])
        else:
            ok = expect in output
        return {"reward": 1.0 if ok else 0.0}
