"""No claim gets stuck: engine errors, leftovers of stopped workers, hostile or odd queue entries."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from orchestrator.handler_api import contract as handler_module
from orchestrator.handler_api.context import JobContext
from orchestrator.spool.events import events_of
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.report.status import pending_count
from orchestrator.submission.submit import submit_file
from tests.core.util import (
    drain_with_a_worker, make_run, rows, serve_in_process, start_worker, stop_worker, wait_until, write_jsonl,
)


class UnstorableOutput(AgentHandler):
    """RUN returns a set: it cannot travel in a ticket (JSON)."""

    name = "unstorable"

    async def init(self, ctx: JobContext) -> dict[str, Any]:
        return {}

    async def run(self, ctx: JobContext, prepared: dict[str, Any]) -> dict[str, Any]:
        return {"seen": {1, 2, 3}}

    async def eval(self, ctx: JobContext, result: dict[str, Any]) -> dict[str, Any]:
        return {"reward": 1.0}


@pytest.fixture
def unstorable_handler() -> Any:
    handler_module._loaded["unstorable"] = UnstorableOutput
    yield
    handler_module._loaded.pop("unstorable", None)


def test_a_stage_output_that_cannot_be_stored_fails_the_job_not_the_claim(tmp_path: Path, unstorable_handler: Any) -> None:
    paths = make_run(tmp_path / "run")
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "unstorable", "instance": {}}] * 2
                                   + [{"handler": "echo", "instance": {"ok": 1}}]))
    serve_in_process(paths)
    assert pending_count(paths) == 0, "a claim was left behind"
    finished = {r["handler"]: r for r in rows(paths)}
    assert finished["echo"]["status"] == "ok"
    bad = finished["unstorable"]
    assert bad["status"] == "failed" and bad["error_stage"] == "run"
    assert "cannot be stored" in bad["error"] and "set" in bad["error"]


def test_claims_left_by_a_stopped_worker_are_returned(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"jobs.batch_size": 1,   # a single ticket file, moved by hand
                                          "leases.heartbeat_s": 0.5, "leases.lease_s": 2.0})
    report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"i": i}} for i in range(3)]))
    gone = "oldnode-7-gone"
    claims = paths.claims(gone)
    claims.mkdir()
    os.rename(paths.init_queue / report.first_job, claims / report.first_job)
    (paths.workers / "gone").mkdir(exist_ok=True)
    (paths.workers / "gone" / f"{gone}.json").write_bytes(orjson.dumps({"node": "oldnode", "state": "stopped"}))
    old = time.time() - 3600
    os.utime(claims, (old, old))
    drain_with_a_worker(paths, timeout=60)
    got = {r["job_id"]: r for r in rows(paths)}
    assert len(got) == 3 and got[report.first_job]["attempt"] == 2
    assert not claims.exists()


def test_a_ticket_whose_job_id_walks_out_of_the_spool_is_quarantined(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"jobs.batch_size": 1})   # a single ticket file, moved by hand
    report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"i": 1}}] * 2))
    ticket_path = paths.init_queue / report.first_job
    ticket = orjson.loads(ticket_path.read_bytes())
    ticket["job"]["job_id"] = "../../evil"
    ticket_path.write_bytes(orjson.dumps(ticket))
    drain_with_a_worker(paths, timeout=60)
    assert not (paths.root / "evil").exists() and not (paths.active / "evil").exists()
    assert [r["job_id"] for r in rows(paths)] == [report.last_job]
    notes = [p.read_text() for p in paths.quarantine.glob("*.reason")]
    assert len(notes) == 1 and "../../evil" in notes[0]


def test_a_directory_in_a_queue_is_quarantined_and_the_worker_goes_on(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    (paths.init_queue / "00-not-a-ticket").mkdir()
    (paths.init_queue / "00-not-a-ticket" / "file").write_text("x")
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"i": i}} for i in range(3)]))
    drain_with_a_worker(paths, timeout=60)
    assert len(rows(paths)) == 3
    assert any(p.is_dir() and p.name.startswith("00-not-a-ticket") for p in paths.quarantine.iterdir())


def test_an_engine_error_in_a_stage_requeues_the_claim_and_gives_up_after_max_attempts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 8 item 8: an exception outside the handler (a bug in the engine) must not leave the
    ticket in active/W. A transient one costs an attempt; a permanent one fails the job, with the
    error, once its attempts are used up; nothing is left pending either way."""
    from orchestrator.worker.job_runner import JobRunner

    paths = make_run(tmp_path / "run", **{"jobs.max_attempts": 3})
    report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"i": i}} for i in range(3)]))
    transient, permanent = report.first_job, report.last_job
    seen: dict[str, int] = {}
    real_context = JobRunner.context

    def buggy_context(self: JobRunner, ticket: Any, stage: Any) -> JobContext:
        if ticket.status is not None:  # the job has ended: only its row is left to write
            return real_context(self, ticket, stage)
        seen[ticket.name] = seen.get(ticket.name, 0) + 1
        if ticket.name == permanent or (ticket.name == transient and seen[ticket.name] == 1):
            raise RuntimeError(f"injected engine bug in {stage.value}")
        return real_context(self, ticket, stage)

    monkeypatch.setattr(JobRunner, "context", buggy_context)
    serve_in_process(paths, timeout=120)
    assert pending_count(paths) == 0, "a claim was left behind"
    assert not [p for p in paths.active.rglob("*") if p.is_file()], "a ticket stayed in active/"
    got = {r["job_id"]: r for r in rows(paths)}
    assert len(got) == 3
    assert got[transient]["status"] == "ok" and got[transient]["attempt"] == 2
    failed = got[permanent]
    assert failed["status"] == "failed" and "injected engine bug" in failed["error"], failed
    assert "gave up after 3 attempts" in failed["error"]


def test_a_worker_stopped_now_returns_its_running_job_to_init_and_says_so(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    report = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 600}}]))
    worker = start_worker(paths)
    try:
        wait_until(lambda: any(e["event"] == "run_started" for e in events_of(paths, report.first_job)),
                   60, "the job to enter RUN")
        os.killpg(worker.pid, signal.SIGUSR1)   # stop now: every claim goes back at once
        assert worker.wait(timeout=60) == 0
    finally:
        stop_worker(worker)
    returned = [e for e in events_of(paths, report.first_job) if e["event"] == "returned"]
    assert [(e["stage"], e["to"]) for e in returned] == [("run", "init")]
    ticket = orjson.loads((paths.init_queue / report.first_job).read_bytes())
    assert ticket["stage"] == "init" and "init" not in ticket["outputs"]
