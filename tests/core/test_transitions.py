"""One owner per ticket transition and per conversion: StageError <-> the ticket's error record,
the merge of stage outputs, and the way back to INIT."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.handler_api.contract import AgentHandler, StageError, merge_stage_outputs
from orchestrator.spool.jobs import JobSpec, JobStatus, Stage
from orchestrator.spool.tickets import Ticket

REPO = Path(__file__).resolve().parents[2]


def job(job_id: str) -> JobSpec:
    return JobSpec(job_id=job_id, group_id=job_id, instance_id=job_id, sample_index=0, handler="echo", instance={})


def test_a_stage_error_survives_the_ticket_without_its_traceback() -> None:
    error = StageError("run", "ValueError", "bad input (at x.py:3 in f)", traceback="Traceback ...")
    record = error.to_record()
    assert record == {"stage": "run", "kind": "ValueError", "message": "bad input (at x.py:3 in f)"}
    decoded = Ticket.decode(Ticket(job("j1"),
                                   error=record).encode(), "j1")
    assert StageError.from_record(decoded.error) == StageError("run", "ValueError", "bad input (at x.py:3 in f)")


def test_later_stages_win_in_the_one_merge_of_outputs() -> None:
    outputs = {"eval": {"reward": 1.0, "k": "eval"}, "init": {"k": "init", "a": 1}, "run": {"k": "run"}}
    assert merge_stage_outputs(outputs) == {"k": "eval", "a": 1, "reward": 1.0}
    assert AgentHandler.final_result(None, None, outputs, None) == {"k": "eval", "a": 1, "reward": 1.0}  # type: ignore[arg-type]


def test_back_to_init_drops_what_the_lost_sandbox_held() -> None:
    ticket = Ticket(job("j2"), stage=Stage.RUN,
                    state={"sandbox": {"id": "x"}, "keep": 1}, outputs={"init": {"a": 1}, "run": {"b": 2}})
    ticket.back_to_init()
    assert ticket.stage is Stage.INIT and ticket.state == {"keep": 1} and ticket.outputs == {"run": {"b": 2}}
    assert ticket.enqueued_at > 0


# The fields that say where a job is and how it ended: only orchestrator/spool/tickets.py writes them.
TRANSITION_FIELDS = {"stage", "status", "error", "attempt", "enqueued_at", "outputs"}


def _ticket_field_writes(path: Path) -> list[str]:
    """`ticket.<field> = ...`, `ticket.<field> += ...` and `ticket.outputs[...] = ...` in one file."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            if isinstance(target, ast.Subscript):
                target = target.value
            if (isinstance(target, ast.Attribute) and target.attr in TRANSITION_FIELDS
                    and isinstance(target.value, ast.Name) and target.value.id == "ticket"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_ticket_writes_its_transition_fields() -> None:
    writes = [w for path in sorted((REPO / "orchestrator").rglob("*.py")) if path.name != "tickets.py"
              for w in _ticket_field_writes(path)]
    assert not writes, "use a Ticket method (orchestrator/spool/tickets.py) instead:\n" + "\n".join(writes)


def test_a_lost_job_resumes_at_eval_when_decided_or_evaluating_else_at_init() -> None:
    running = Ticket(job("j3"), stage=Stage.RUN, state={"sandbox": {"id": "x"}}, outputs={"init": {"a": 1}})
    assert running.return_after_loss() is Stage.INIT and running.stage is Stage.INIT and running.state == {}
    evaluating = Ticket(job("j4"), stage=Stage.EVAL, outputs={"init": {"a": 1}, "run": {"b": 2}})
    assert evaluating.return_after_loss() is Stage.EVAL and evaluating.outputs == {"init": {"a": 1}, "run": {"b": 2}}
    decided = Ticket(job("j5"), stage=Stage.RUN, status=JobStatus.FAILED, state={"sandbox": {"id": "y"}})
    assert decided.return_after_loss() is Stage.EVAL and decided.stage is Stage.EVAL


def test_a_job_ended_early_keeps_its_status_error_and_output() -> None:
    ticket = Ticket(job("j6"), stage=Stage.RUN)
    error = StageError("run", "timeout", "over budget")
    ticket.end_early(JobStatus.TIMEOUT, error.to_record(), Stage.RUN, {"partial": 1})
    assert (ticket.status, ticket.error, ticket.outputs) == (JobStatus.TIMEOUT, error.to_record(), {"run": {"partial": 1}})
    kept = Ticket(job("j7"), stage=Stage.RUN, outputs={"run": {"old": 1}})
    kept.end_early(JobStatus.CANCELLED, None, Stage.RUN, {})
    assert kept.error is None and kept.outputs == {"run": {"old": 1}}   # an empty output does not erase one
