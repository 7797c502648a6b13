"""The rule behind "a full spool costs no attempt": which errors are the spool's, and the bound
that still ends a job on a spool that keeps filling up (orchestrator/worker/full_spool.py)."""

from __future__ import annotations

import errno
from pathlib import Path

from orchestrator.spool.jobs import JobSpec, JobStatus, Stage
from orchestrator.spool.tickets import Ticket
from orchestrator.worker.full_spool import FREE_LOSSES, disk_full_error, fills_the_spool

MAX_ATTEMPTS = 3
GAVE_UP = {"stage": "run", "kind": "attempts_exhausted", "message": "the spool is full; gave up"}


def ticket_in_run() -> Ticket:
    job = JobSpec(job_id="j1", group_id="j1", instance_id="j1", sample_index=0, handler="echo", instance={})
    return Ticket(job, stage=Stage.RUN, state={"sandbox": {"id": "x"}}, outputs={"init": {"a": 1}})


def test_losses_to_a_full_spool_are_free_up_to_the_budget_then_charged_until_the_job_fails() -> None:
    ticket = ticket_in_run()
    for loss in range(FREE_LOSSES):
        assert ticket.return_after_infrastructure_loss("the spool is full", FREE_LOSSES, GAVE_UP, MAX_ATTEMPTS) is False
        assert (ticket.attempt, ticket.status, ticket.stage) == (1, None, Stage.INIT), f"loss {loss + 1}"
        assert "sandbox" not in ticket.state, "a returned job gets a fresh sandbox"
        ticket.mark_enqueued(Stage.RUN)   # claimed and prepared again: it meets the full spool in RUN
    for attempt in range(2, MAX_ATTEMPTS + 1):
        assert ticket.return_after_infrastructure_loss("the spool is full", FREE_LOSSES, GAVE_UP, MAX_ATTEMPTS) is True
        assert (ticket.attempt, ticket.status) == (attempt, None)
    ticket.return_after_infrastructure_loss("the spool is full", FREE_LOSSES, GAVE_UP, MAX_ATTEMPTS)
    assert (ticket.status, ticket.error, ticket.stage) == (JobStatus.FAILED, GAVE_UP, Stage.EVAL)
    losses = [entry for entry in ticket.history if "infrastructure_loss" in entry]
    assert len(losses) == FREE_LOSSES + MAX_ATTEMPTS
    assert [entry["charged"] for entry in losses] == [False] * FREE_LOSSES + [True] * MAX_ATTEMPTS


def test_a_job_lost_after_its_run_keeps_its_output_and_goes_on_to_eval() -> None:
    ticket = ticket_in_run()
    ticket.record_output(Stage.RUN, {"b": 2})
    ticket.mark_enqueued(Stage.EVAL)   # its ticket could not be saved on the way to queue/eval
    ticket.return_after_infrastructure_loss("the spool is full", FREE_LOSSES, GAVE_UP, MAX_ATTEMPTS)
    assert (ticket.stage, ticket.attempt, ticket.outputs["run"]) == (Stage.EVAL, 1, {"b": 2})


def test_disk_full_errors_are_found_behind_wrappers_and_told_apart_by_filesystem(tmp_path: Path) -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise full
        except OSError as exc:
            raise RuntimeError("could not save the ticket") from exc
    except RuntimeError as wrapped:
        assert disk_full_error(wrapped) is full
    assert disk_full_error(OSError(errno.EIO, "I/O error")) is None
    assert disk_full_error(ValueError("no")) is None

    spool = tmp_path / "run"
    spool.mkdir()
    in_the_job_dir = OSError(errno.ENOSPC, "No space left on device", str(spool / "jobs" / "01" / "j1" / "out"))
    elsewhere = OSError(errno.ENOSPC, "No space left on device", "/proc/self/not-the-spool")
    assert fills_the_spool(in_the_job_dir, spool)
    assert not fills_the_spool(elsewhere, spool)
    assert fills_the_spool(OSError(errno.EDQUOT, "Disk quota exceeded"), spool), "a quota does not show in free space"
    # naming no file: the spool's only when it has (almost) no room left, which this test's disk has
    assert not fills_the_spool(OSError(errno.ENOSPC, "No space left on device"), spool)
