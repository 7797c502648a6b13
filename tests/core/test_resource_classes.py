"""Resource classes (issue 41, item 4): a worker admits jobs by class within its node's budget, short
jobs are not stuck behind long ones, and a class that can never run is refused at submit or config
load with the fix, never left queued for ever. Without classes, tickets are byte for byte as before."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from hpc_rollout.handlers.sleep import SleepHandler
from orchestrator.config import ConfigError, RunConfig
from orchestrator.handler_api.contract import _loaded
from orchestrator.resource_class import ResourceClass
from orchestrator.spool import fsops
from orchestrator.spool.batches import queued_tickets, read_entry
from orchestrator.submission.submit import SubmitError, SubmitReport
from orchestrator.trainer.api import Spool
from orchestrator.worker.admission import Admission
from tests.core.util import (
    FAST, cli, make_run, rows, serve_in_process, start_worker, stop_worker, wait_drained, wait_until, write_jsonl,
)

BUDGET_MB = 4608   # two long jobs (2 x 2048) and two short ones (2 x 256)
CLASSES = {
    "node.memory_mb": BUDGET_MB,
    "classes.long.memory_mb": 2048, "classes.long.expected_s": 0.4,
    "classes.short.memory_mb": 256, "classes.short.expected_s": 0.01,
    "pools.init": 2, "pools.run": 4, "pools.eval": 2,
}
LONG = {"handler": "sleep", "instance": {"run": 0.4}}
SHORT = {"handler": "sleep", "instance": {"run": 0.01}}


def classed_run(root: Path, **overrides: Any) -> Spool:
    return Spool.create(root, **{**FAST, **CLASSES, **overrides})


def seconds(stamp: Any) -> float:
    return stamp.timestamp() if isinstance(stamp, datetime) else float(stamp)


def events(paths: Any, kind: str) -> list[dict[str, Any]]:
    found = [orjson.loads(line) for log in paths.root.glob("events/*.jsonl")
             for line in fsops.read_bytes(log, 1 << 30).splitlines() if line.strip()]
    return [e for e in found if e["event"] == kind]


def admitted(paths: Any) -> list[dict[str, Any]]:
    """The worker's own accounting: an `admitted` event per job started, with the memory then in use."""
    return events(paths, "admitted")


def assert_shorts_done_before_the_last_long_starts(spool: Spool, long_jobs: SubmitReport,
                                                  short_jobs: SubmitReport) -> None:
    finished = rows(spool.paths)
    assert len(finished) == long_jobs.jobs + short_jobs.jobs and {r["status"] for r in finished} == {"ok"}
    longs = [r for r in finished if r["job_id"].startswith(long_jobs.submission_id)]
    shorts = [r for r in finished if r["job_id"].startswith(short_jobs.submission_id)]
    last_long_start = max(seconds(r["run_started_at"]) for r in longs)
    assert all(seconds(r["finished_at"]) < last_long_start for r in shorts), (shorts, last_long_start)


def test_a_short_job_behind_many_long_ones_starts_before_they_all_finish(tmp_path: Path) -> None:
    spool = classed_run(tmp_path / "run")
    long_jobs = spool.submit([LONG] * 10, resource_class="long", batch_size=1)
    worker = start_worker(spool.paths)
    try:
        wait_until(lambda: len(events(spool.paths, "run_started")) >= 2, 30, "the first long jobs to start")
        short_jobs = spool.submit([SHORT] * 2, resource_class="short")   # behind every long one
        wait_drained(spool.paths, 60)
    finally:
        assert stop_worker(worker) == 0
    # First come, first served, the short jobs would start only once the last long one had.
    assert_shorts_done_before_the_last_long_starts(spool, long_jobs, short_jobs)


def test_classes_share_the_slots_when_memory_is_not_what_binds(tmp_path: Path) -> None:
    # No node budget: classes alone are in force, and the long class may not take every slot
    # while short jobs wait (weights equal: the class with fewer jobs on the worker goes first).
    spool = classed_run(tmp_path / "run", **{"node.memory_mb": 0, "pools.run": 2, "pools.init": 2})
    long_jobs = spool.submit([LONG] * 8, resource_class="long")
    short_jobs = spool.submit([SHORT] * 4, resource_class="short")
    serve_in_process(spool.paths, timeout=60)
    assert_shorts_done_before_the_last_long_starts(spool, long_jobs, short_jobs)
    by_class = [e["class"] for e in admitted(spool.paths)]
    assert by_class[0] == "long" and by_class[:4].count("short") >= 2, by_class   # taking turns from the start


def test_the_node_budget_is_never_exceeded(tmp_path: Path) -> None:
    spool = classed_run(tmp_path / "run")
    spool.submit([LONG] * 6, resource_class="long")
    spool.submit([SHORT] * 12, resource_class="short")
    spool.submit([LONG] * 2, resource_class="long")
    serve_in_process(spool.paths, timeout=60)
    finished = rows(spool.paths)
    assert len(finished) == 20 and {r["status"] for r in finished} == {"ok"}
    in_use = [e["memory_mb_in_use"] for e in admitted(spool.paths)]
    assert len(in_use) == 20 and max(in_use) <= BUDGET_MB, in_use
    assert max(in_use) > BUDGET_MB // 2, "the budget was used, not left idle"
    (beat,) = [orjson.loads(fsops.read_bytes(p)) for p in spool.paths.workers.glob("gone/*.json")]   # its last beat
    assert beat["classes"]["memory_mb_peak"] == max(in_use) and beat["classes"]["memory_mb_in_use"] == 0, beat
    # Seen from the rows too: never more than two long RUNs (2 x 2048 MB) at once.
    spans = sorted((seconds(r["run_started_at"]), seconds(r["run_ended_at"])) for r in finished
                   if r["run_s"] and r["run_s"] > 0.2)
    for start, _ in spans:
        assert sum(1 for s, e in spans if s <= start < e) <= 2, spans


def test_a_class_quota_bounds_its_jobs_on_a_worker(tmp_path: Path) -> None:
    spool = classed_run(tmp_path / "run", **{"node.memory_mb": 0, "classes.long.max_jobs": 1})
    spool.submit([LONG] * 3, resource_class="long")
    spool.submit([SHORT] * 4, resource_class="short")
    serve_in_process(spool.paths, timeout=60)
    finished = rows(spool.paths)
    assert len(finished) == 7 and {r["status"] for r in finished} == {"ok"}
    spans = sorted((seconds(r["run_started_at"]), seconds(r["run_ended_at"])) for r in finished if r["run_s"] > 0.2)
    assert len(spans) == 3 and all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans


def test_a_free_run_slot_goes_to_the_class_with_fewer_runs() -> None:
    admission = Admission(RunConfig().with_overrides(CLASSES))
    long_, short = (RunConfig().with_overrides(CLASSES).classes[name] for name in ("long", "short"))
    for name, job_class in (("a-long", long_), ("b-long", long_), ("c-long", long_), ("d-short", short)):
        admission.reserve(name, job_class)
    assert admission.next_to_run(["b-long", "c-long", "d-short"], in_run=["a-long"]) == "d-short"
    assert admission.next_to_run(["b-long", "c-long"], in_run=["a-long", "d-short"]) == "b-long"
    assert admission.report()["memory_mb_in_use"] == 3 * 2048 + 256


def test_an_unknown_class_is_refused_at_submit_naming_the_declared_ones(tmp_path: Path) -> None:
    spool = classed_run(tmp_path / "run")
    with pytest.raises(SubmitError, match=r"--class 'huge' is not a class of this run \(declared: long, short\)"):
        spool.submit([LONG], resource_class="huge")
    assert not queued_tickets(spool.paths.init_queue)


def test_a_class_above_the_node_budget_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"class 'long' needs 2048 MB .* raise \[node\] memory_mb or lower "
                                          r"\[classes.long\] memory_mb"):
        RunConfig().with_overrides({**CLASSES, "node.memory_mb": 1024})
    with pytest.raises(ConfigError, match=r"classes.long: unknown key 'memroy_mb'; valid: memory_mb"):
        RunConfig.from_dict({"classes": {"long": {"memroy_mb": 10}}})
    with pytest.raises(ConfigError, match=r"classes.long.weight = 0 is outside"):
        RunConfig.from_dict({"classes": {"long": {"weight": 0}}})


def test_a_job_without_class_above_the_budget_is_refused_at_submit_naming_the_fix(tmp_path: Path) -> None:
    spool = classed_run(tmp_path / "run", **{"sandbox.total_memory_mb": 8192})
    report = spool.submit([LONG])
    assert report.jobs == 0 and len(report.rejected) == 1
    assert "handler 'sleep' has no resource class" in report.rejected[0].reason
    assert '[classes.NAME] handlers = ["sleep"]' in report.rejected[0].reason


def test_a_job_whose_class_outgrew_the_budget_fails_with_the_reason_not_a_hang(tmp_path: Path) -> None:
    spool = classed_run(tmp_path / "run", **{"classes.big.memory_mb": 4096})
    spool.submit([SHORT], resource_class="big")
    # The operator shrinks the node's budget and drops the class: the ticket still carries 4096 MB.
    config = RunConfig.load(spool.paths.run_config)
    shrunk = RunConfig.from_dict({"node": {"memory_mb": 1024}, "classes": {"short": {"memory_mb": 256}},
                                  "leases": {"heartbeat_s": 0.2, "lease_s": 2.0}})
    spool.paths.run_config.write_text(shrunk.to_toml())
    assert config.classes["big"].memory_mb == 4096
    serve_in_process(spool.paths, timeout=30)
    (row,) = rows(spool.paths)
    assert row["status"] == "failed" and "ResourceClassError" in row["error"], row["error"]
    assert "needs 4096 MB" in row["error"] and "raise [node] memory_mb" in row["error"]


def test_without_classes_tickets_carry_no_class_and_batches_are_as_before(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    Spool.open(paths.root).submit([LONG] * 3)
    (entry,) = list(paths.init_queue.iterdir())
    assert b"resource_class" not in entry.read_bytes() and entry.name.endswith("+3")
    assert "classes" not in RunConfig.load(paths.run_config).to_toml()


def test_submit_keeps_a_batch_to_one_class_and_classes_follow_handlers(tmp_path: Path) -> None:
    spool = classed_run(tmp_path / "run", **{"classes.short.handlers": ["echo"], "classes.long.handlers": ["sleep"]})
    echo = {"handler": "echo", "instance": {}}
    report = spool.submit([echo, LONG, LONG, echo])
    assert report.jobs == 4 and report.batches == 3, report
    by_entry = {entry.name: [t.job.resource_class["name"] for t in read_entry(entry)]   # type: ignore[index]
                for entry in spool.paths.init_queue.iterdir()}
    assert sorted(by_entry.values()) == [["long", "long"], ["short"], ["short"]], by_entry


def test_the_command_line_declares_classes_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    refused = cli("init", str(tmp_path / "small"), "--set", "node.memory_mb=1024", "--set",
                  "classes.long.memory_mb=2048", check=False)
    assert refused.returncode == 1 and "raise [node] memory_mb" in refused.stderr, refused.stderr
    cli("init", str(tmp_path / "run"), "--set", "node.memory_mb=4096", "--set", "classes.long.memory_mb=2048")
    tasks = write_jsonl(tmp_path / "t.jsonl", [LONG])
    unknown = cli("submit", str(tmp_path / "run"), str(tasks), "--class", "huge", check=False)
    assert unknown.returncode == 1 and "--class 'huge' is not a class of this run (declared: long)" in unknown.stderr
    cli("submit", str(tmp_path / "run"), str(tasks), "--class", "long")
    (ticket,) = queued_tickets(tmp_path / "run" / "queue" / "init")
    assert ticket.job.resource_class == {"name": "long", "memory_mb": 2048, "cpus": 1, "expected_s": 60.0,
                                         "weight": 1.0, "max_jobs": 0}


class SweLike(SleepHandler):
    name = "swe_like"
    resource_class = ResourceClass("swe_like", memory_mb=3000, cpus=2, expected_s=600)


class TooBig(SleepHandler):
    name = "too_big"
    resource_class = ResourceClass("too_big", memory_mb=5000)


def test_a_handler_declares_its_class_and_one_above_the_budget_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for handler in (SweLike, TooBig):
        monkeypatch.setitem(_loaded, handler.name, handler)
    spool = classed_run(tmp_path / "run")
    accepted = spool.submit([{"handler": "swe_like", "instance": {"run": 0.01}}])
    (ticket,) = queued_tickets(spool.paths.init_queue)
    assert accepted.jobs == 1 and ticket.job.resource_class is not None
    assert (ticket.job.resource_class["name"], ticket.job.resource_class["memory_mb"]) == ("swe_like", 3000)
    refused = spool.submit([{"handler": "too_big", "instance": {"run": 0.01}}])
    assert refused.jobs == 0 and "class 'too_big' needs 5000 MB" in refused.rejected[0].reason
    assert f"the node's whole budget of {BUDGET_MB} MB" in refused.rejected[0].reason
