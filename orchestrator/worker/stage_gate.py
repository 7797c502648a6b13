"""Whether a stage is worth running: the checks between a job's claim and its handler call.

A job may end before its handler is called: it was cancelled; (before INIT) its resource class
can never start on this worker, or the run's sandbox policy refuses what its row asks for;
(before EVAL) the policy that sampled it is too old for the trainer to use any of its samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.handler_api.contract import AgentHandler
from orchestrator.sandbox.policy import SandboxPolicyError
from orchestrator.spool.jobs import JobStatus, Stage, StageError
from orchestrator.spool.staleness import STALE_KIND, job_stale_reason
from orchestrator.spool.tickets import Ticket
from orchestrator.worker.state import WorkerState


@dataclass(frozen=True)
class Refusal:
    """How a job ends instead of running its stage."""

    status: JobStatus
    error: StageError


class StageGate:
    def __init__(self, state: WorkerState) -> None:
        self.state = state

    def refusal(self, handler: AgentHandler, ticket: Ticket, stage: Stage, previous: dict[str, Any]) -> Refusal | None:
        """Why `stage` of the job must not run (and how it ends); None: go on. `previous`: the
        output of the stage before (RUN's, for EVAL)."""
        if self.state.cancels.is_cancelled(ticket.job):
            return Refusal(JobStatus.CANCELLED, StageError(stage.value, "cancelled", "cancelled before it started"))
        if stage is Stage.INIT and (refused := self._class_refusal(ticket)):
            return Refusal(JobStatus.FAILED, StageError(stage.value, "ResourceClassError", refused))
        if stage is Stage.INIT and (refused := self._sandbox_refusal(handler, ticket)):
            return Refusal(JobStatus.FAILED, StageError(stage.value, "SandboxPolicyError", refused))
        if stage is Stage.EVAL and (stale := self._stale(ticket.job.staleness, previous)):
            return Refusal(JobStatus.CANCELLED, StageError(stage.value, STALE_KIND, stale))
        return None

    def _class_refusal(self, ticket: Ticket) -> str | None:
        """Why the job's resource class can never start on this worker (its budget too small); None: it can."""
        admission = self.state.admission
        return None if admission is None else admission.refusal(admission.class_of(ticket.job))

    def _sandbox_refusal(self, handler: AgentHandler, ticket: Ticket) -> str | None:
        """Why the run's sandbox policy refuses what the job's row asks for, before INIT runs any of
        it (a ticket planted without `submit`); None: allowed, or left to INIT, which checks again."""
        services = self.state.services
        try:
            services.sandbox_policy.decide(services.sandbox_defaults, handler.sandbox_request(ticket.job.instance),
                                           handler=ticket.job.handler, job_dir=self.state.paths.job_dir(ticket.name))
        except SandboxPolicyError as exc:
            return str(exc)
        except Exception:  # a row the handler cannot read: INIT fails with the handler's own reason  # noqa: BLE001
            return None
        return None

    def _stale(self, staleness: str, run_output: dict[str, Any]) -> str | None:
        """Why evaluating this RUN output is pointless: the trainer would train on none of its
        samples (restart: its oldest is too old; continue: even its newest is). None: go on."""
        oldest, newest = run_output.get("policy_version_min"), run_output.get("policy_version_max")
        if not isinstance(oldest, int):
            return None
        try:
            floor = self.state.registry.read().min_policy_version
        except Exception:  # an unreadable registry must not stop evaluation  # noqa: BLE001
            return None
        return job_stale_reason(staleness, oldest, newest if isinstance(newest, int) else oldest, floor)
