"""`echo`: returns its instance. The cheapest possible job, for tests and overhead benchmarks."""

from __future__ import annotations

from typing import Any

from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import AgentHandler


class EchoHandler(AgentHandler):
    name = "echo"

    async def init(self, ctx: JobContext) -> dict[str, Any]:
        return {}

    async def run(self, ctx: JobContext, prepared: dict[str, Any]) -> dict[str, Any]:
        return {"echo": ctx.job.instance}

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        reward = ctx.job.instance.get("reward", 1.0)
        return {"reward": reward if isinstance(reward, (int, float)) else 1.0}
