"""One owner per ticket transition and per conversion: StageError <-> the ticket's error record,
the merge of stage outputs, and the way back to INIT."""

from __future__ import annotations

from orchestrator.handler import AgentHandler, StageError, merge_stage_outputs
from orchestrator.jobs import JobSpec, Stage
from orchestrator.tickets import Ticket


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
