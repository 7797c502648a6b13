"""Submit: row shapes, groups of samples, bad rows reported by line, strict mode, sampling."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.spool import fsops
from orchestrator.spool.batches import queued_tickets
from orchestrator.spool.job_ids import new_submission_id
from orchestrator.submission.submit import SubmitError, parse_sampling, submit_file
from orchestrator.spool.tickets import Ticket
from tests.core.util import FAST, cli, make_run, start_worker, stop_worker, wait_until, write_jsonl


def queued(paths) -> list[Ticket]:
    return queued_tickets(paths.init_queue)   # single tickets and batches (orchestrator/spool/batches.py)


def test_three_row_shapes_and_sample_groups(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "t.jsonl", [
        {"handler": "echo", "instance": {"x": 1, "instance_id": "task-a"}},
        {"data_source": "echo", "prompt": [{"role": "user", "content": "hi"}], "reward_model": {"ground_truth": "1"},
         "extra_info": {"index": 7}},
    ])
    report = submit_file(paths, tasks, samples=3)
    assert (report.tasks, report.jobs, report.rejected) == (2, 6, [])
    tickets = queued(paths)
    assert [t.job.sample_index for t in tickets] == [0, 1, 2, 0, 1, 2]
    assert len({t.job.group_id for t in tickets}) == 2
    assert {t.job.group_size for t in tickets} == {3}
    first, verl = tickets[0].job, tickets[3].job
    assert first.instance_id == "task-a" and first.instance == {"x": 1, "instance_id": "task-a"}
    assert verl.handler == "echo" and verl.data_source == "echo" and verl.instance_id == "7"
    assert verl.instance["reward_model"] == {"ground_truth": "1"}
    # names sort in submission order
    assert [t.name for t in tickets] == sorted(t.name for t in tickets)

    bare = write_jsonl(tmp_path / "bare.jsonl", [{"y": 2}])
    assert submit_file(paths, bare).rejected[0].line == 1  # no handler given
    report = submit_file(paths, bare, handler="echo")
    assert report.jobs == 1 and queued(paths)[-1].job.instance == {"y": 2}


def test_every_bad_row_is_reported_and_good_rows_are_kept(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "t.jsonl", [
        {"handler": "echo", "instance": {}},
        "{broken json",
        {"handler": "no-such-handler", "instance": {}},
        [1, 2],
        {"handler": "sleep", "instance": {"run": {"uniform": [0, 1], "lognormal": {"mean": 1}}}},
        {"handler": "echo", "instance": "not an object"},
        {"handler": "echo", "instance": {"ok": True}},
    ])
    report = submit_file(paths, tasks)
    assert report.jobs == 2
    reasons = {p.line: p.reason for p in report.rejected}
    assert sorted(reasons) == [2, 3, 4, 5, 6]
    assert "not valid JSON" in reasons[2]
    assert "unknown handler 'no-such-handler'" in reasons[3] and "echo" in reasons[3]
    assert "exactly one of" in reasons[5]
    saved = orjson.loads((paths.submissions / f"{report.submission_id}.json").read_bytes())
    assert saved["jobs"] == 2 and len(saved["rejected"]) == 5


def test_cli_exit_status_and_strict(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}, "nope"])
    result = cli("submit", str(paths.root), str(tasks), check=False)
    assert result.returncode == 1
    assert "t.jsonl:2" in result.stderr and "1 job(s)" in result.stdout
    strict = cli("submit", str(paths.root), str(tasks), "--strict", check=False)
    assert strict.returncode == 1 and "rejected the whole file" in strict.stderr
    assert len(fsops.list_names(paths.init_queue)) == 1  # nothing more from the strict call
    good = write_jsonl(tmp_path / "good.jsonl", [{"handler": "echo", "instance": {}}])
    assert cli("submit", str(paths.root), str(good), "--strict").returncode == 0


def test_parquet_input(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    table = pa.Table.from_pylist([
        {"data_source": "echo", "prompt": [{"role": "user", "content": f"q{i}"}], "extra_info": {"index": i}}
        for i in range(5)
    ])
    pq.write_table(table, tmp_path / "t.parquet")
    report = submit_file(paths, tmp_path / "t.parquet", samples=2)
    assert report.jobs == 10 and not report.rejected
    assert sorted({t.job.instance_id for t in queued(paths)}) == ["0", "1", "2", "3", "4"]


def test_sampling_parameters(tmp_path: Path) -> None:
    file = tmp_path / "s.json"
    file.write_text('{"temperature": 1.0, "max_tokens": 64}')
    with pytest.raises(SubmitError, match="unknown sampling parameter 'note'"):
        parse_sampling(("note=plain",), None)
    params = parse_sampling(("temperature=0.7", 'stop=["</s>"]', "note=plain"), file, unchecked=True)
    assert params == {"temperature": 0.7, "max_tokens": 64, "stop": ["</s>"], "note": "plain"}
    with pytest.raises(SubmitError, match="top_p"):
        parse_sampling(("top_p=1.5",), None)
    with pytest.raises(SubmitError, match="KEY=VALUE"):
        parse_sampling(("temperature",), None)
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}])
    submit_file(paths, tasks, sampling=params, sampling_unchecked=True)
    assert queued(paths)[0].job.sampling == params


def test_submit_needs_a_run_directory(tmp_path: Path) -> None:
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}])
    result = cli("submit", str(tmp_path), str(tasks), check=False)
    assert result.returncode != 0 and "hpc-rollout init" in result.stderr


def test_submission_ids_sort_in_the_order_made_even_within_a_millisecond() -> None:
    ids = [new_submission_id() for _ in range(200)]   # far faster than 200 ms
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_a_trainers_steps_scan_the_installed_handlers_once_not_at_every_submit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl rows name their data_source, which submit looks up as a handler before the fallback:
    every step of a trainer scanned every installed distribution's entry points for it (10-15 ms
    of each verl step's start). A scan is reused for LISTING_REUSE_S; then a handler installed
    meanwhile is found."""
    from orchestrator.handler_api import contract
    from orchestrator.trainer.api import Spool

    clock = [100.0]
    monkeypatch.setattr(contract.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(contract, "_listing", None)
    scans = []
    original = contract.entry_points
    monkeypatch.setattr(contract, "entry_points", lambda **kw: (scans.append(kw), original(**kw))[1])
    spool = Spool.open(make_run(tmp_path / "run").root)
    row = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1 + 1?"}],
           "reward_model": {"ground_truth": "2"}}
    for step in range(5):
        report = spool.submit([row] * 4, handler="answer", samples=2)
        assert not report.rejected and report.jobs == 8
    assert len(scans) == 1
    clock[0] += contract.LISTING_REUSE_S + 1
    spool.submit([row], handler="answer")
    assert len(scans) == 2
    with pytest.raises(contract.HandlerError, match="unknown handler 'nope'.*installed handlers: .*answer"):
        contract.load_handler("nope")
    assert len(scans) == 2


def test_submit_points_to_launch_only_when_no_worker_is_running(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **FAST)
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {}}])
    assert "next: hpc-rollout launch" in cli("submit", str(paths.root), str(tasks)).stdout
    worker = start_worker(paths)
    try:
        wait_until(lambda: any(paths.workers.glob("*.json")), 60, "the worker's heartbeat")
        said = cli("submit", str(paths.root), str(tasks), "--again").stdout
    finally:
        stop_worker(worker)
    assert "1 worker(s) running will take them" in said and "hpc-rollout launch" not in said, said
