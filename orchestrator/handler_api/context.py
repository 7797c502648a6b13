"""JobContext: what a handler sees of the system while one stage of one job runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.config import Proxy, Rewards
from orchestrator.sandbox.policy import SandboxPolicy, merge_sandbox_options
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import SpoolPaths

if TYPE_CHECKING:
    from orchestrator.llm.router import Router
    from orchestrator.sandbox.base import Sandbox

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerServices:
    """Per-worker settings and shared clients that every job context can reach."""

    paths: SpoolPaths
    worker_id: str
    node: str
    runtime: str = "auto"                      # apptainer | bwrap | local | auto
    sandbox_defaults: dict[str, Any] = field(default_factory=dict)
    # What a job may ask for beyond the defaults (run.toml [sandbox]); the default allows nothing more.
    sandbox_policy: SandboxPolicy = field(default_factory=SandboxPolicy)
    emit: Callable[[str, str, dict[str, Any]], None] = lambda job_id, name, fields: None
    llm_router: "Router | None" = None         # built by the worker from its RunConfig (None outside a worker)
    proxy: Proxy = field(default_factory=Proxy)   # run.toml [proxy]: the harness proxy's budgets
    rewards: Rewards = field(default_factory=Rewards)   # run.toml [rewards]: reward code the operator allows


__all__ = ["JobContext", "WorkerServices", "merge_sandbox_options"]


@dataclass
class JobContext:
    job: JobSpec
    stage: Stage
    attempt: int
    services: WorkerServices
    # JSON state carried in the ticket from stage to stage (e.g. the sandbox descriptor).
    state: dict[str, Any] = field(default_factory=dict)
    _sandbox: "Sandbox | None" = None

    @property
    def paths(self) -> SpoolPaths:
        return self.services.paths

    @property
    def node(self) -> str:
        return self.services.node

    @property
    def worker_id(self) -> str:
        return self.services.worker_id

    def artifact_dir(self) -> Path:
        """The job's own directory on the shared filesystem, created on first use."""
        return self.paths.make_job_dir(self.job.job_id)

    def event(self, name: str, **fields: Any) -> None:
        """Record a handler event in the job's timeline (`hpc-rollout inspect`)."""
        self.services.emit(self.job.job_id, name, fields)

    def sandbox_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """What a sandbox of this job starts with: `options` over the run's defaults, as far as the
        run's policy allows (SandboxPolicyError otherwise; orchestrator/sandbox/policy.py)."""
        return self.services.sandbox_policy.decide(self.services.sandbox_defaults, options, handler=self.job.handler,
                                                   job_dir=self.paths.job_dir(self.job.job_id))

    async def open_sandbox(self, **options: Any) -> "Sandbox":
        """Start this job's sandbox with the worker's runtime; it is closed after RUN."""
        from orchestrator.sandbox.start import start_sandbox

        merged = self.sandbox_options(options)
        sandbox = await start_sandbox(
            self.services.runtime, job_id=self.job.job_id, paths=self.paths, **merged
        )
        self._sandbox = sandbox
        self.state["sandbox"] = sandbox.descriptor()
        if self.state["sandbox"].get("workspace_removable"):
            self.state["remove_workspaces"] = True  # the worker removes them once the row is committed
        self.event("sandbox_started", runtime=sandbox.kind)
        return sandbox

    async def sandbox(self) -> "Sandbox":
        """The sandbox opened in INIT, re-attached when RUN happens in another process."""
        if self._sandbox is None:
            descriptor = self.state.get("sandbox")
            if descriptor is None:
                raise RuntimeError(f"job {self.job.job_id} has no sandbox: open one in init")
            from orchestrator.sandbox.start import attach_sandbox

            self._sandbox = await attach_sandbox(descriptor)
        return self._sandbox

    async def close_runtime(self) -> None:
        """Close the sandbox, if any. Safe to call twice and when none was opened."""
        if self._sandbox is None and "sandbox" in self.state:
            try:
                from orchestrator.sandbox.start import attach_sandbox

                self._sandbox = await attach_sandbox(self.state["sandbox"])
            except Exception as exc:  # already gone: nothing to close
                log.debug("sandbox of %s not attachable on close: %s", self.job.job_id, exc)
        if self._sandbox is not None:
            await self._sandbox.close()
            self.event("sandbox_closed")
        self._sandbox = None
        self.state.pop("sandbox", None)
