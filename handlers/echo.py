"""`echo`: returns its instance. The cheapest possible job, for tests and overhead benchmarks."""

from __future__ import annotations

from typing import Any

from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key

SCHEMA = InstanceSchema((instance_key("reward", Kind.NUMBER, "the reward EVAL returns", default=1.0),), open=True)


class EchoHandler(AgentHandler):
    name = "echo"
    instance_schema = SCHEMA   # open: any other key is echoed back as it is

    async def init(self, ctx: JobContext) -> dict[str, Any]:
        return {}

    async def run(self, ctx: JobContext, prepared: dict[str, Any]) -> dict[str, Any]:
        return {"echo": ctx.job.instance}

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        reward = SCHEMA.value(ctx.job.instance, "reward")
        return {"reward": reward if isinstance(reward, (int, float)) else 1.0}
