"""A tool agent whose tools include python starts its interpreter at INIT (Sandbox.warm): it boots
during setup and the first LLM turn, and the first python call runs in it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hpc_rollout.handlers.math_task import MathHandler
from hpc_rollout.handlers.shell import ShellHandler
from orchestrator.config import RunConfig
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.handler_api.context import JobContext, WorkerServices
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import current_node
from tests.agents.conftest import needs_bwrap
from tests.core.util import make_run

# The sandbox's own /proc (bubblewrap gives it a pid namespace): the python tool's interpreters in it.
REPLS = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q python_repl && echo ${p#/proc/}; done"


def repls_after_init(tmp_path: Path, handler: AgentHandler, instance: dict) -> tuple[list[str], str | None]:
    """The interpreters running in the job's sandbox right after INIT, and the pid the first python call ran in."""
    paths = make_run(tmp_path)
    config = RunConfig.load(paths.run_config)
    job = JobSpec(job_id="w-0000000-0000", group_id="w-0000000", instance_id="i", sample_index=0,
                  handler=handler.name, instance=instance)
    services = WorkerServices(paths=paths, worker_id="w", node=current_node(), runtime="bwrap",
                              sandbox_defaults=config.sandbox.defaults())
    ctx = JobContext(job=job, stage=Stage.INIT, attempt=1, services=services)

    async def init_then_look() -> tuple[list[str], str | None]:
        await handler.init(ctx)
        sandbox = await ctx.sandbox()
        try:
            running = (await sandbox.bash(REPLS)).output.split()
            first = (await sandbox.python("import os\nos.getpid()")).result if running else None
            return running, first
        finally:
            await ctx.close_runtime()

    return asyncio.run(init_then_look())


@needs_bwrap
def test_a_math_agents_interpreter_runs_before_its_first_python_call(tmp_path: Path) -> None:
    running, first = repls_after_init(tmp_path, MathHandler(), {"problem": "1 + 1", "answer": "2"})
    assert len(running) == 1, f"interpreters after INIT: {running}"
    assert first == running[0]   # the first call ran in the warmed interpreter, none started for it


@needs_bwrap
def test_an_agent_without_the_python_tool_starts_no_interpreter(tmp_path: Path) -> None:
    running, _ = repls_after_init(tmp_path, ShellHandler(), {"commands": ["true"]})
    assert running == []
