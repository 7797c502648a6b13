"""`hpc-rollout retry`: a run's failed jobs queued again with fresh ids, earlier attempts kept and
shown by `inspect` (issue 39, item 6: a user looked for a command to retry a run's failed jobs)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.spool.batches import queued_tickets
from tests.core.util import cli, drain_with_a_worker, make_run, rows, write_jsonl

FAILING = {"handler": "sleep", "instance": {"run": 0.01, "fail": {"run": 1.0}, "seed": "a"}}
PASSING = {"handler": "sleep", "instance": {"run": 0.01, "seed": "b"}}


def retry_record(run: Path, output: str) -> dict:
    retry_id = output.split()[1].rstrip(":")
    return json.loads((run / "submissions" / f"{retry_id}.json").read_text())


def test_failed_jobs_come_back_with_fresh_ids_and_every_attempt_is_shown(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    run = str(paths.root)
    cli("submit", run, str(write_jsonl(tmp_path / "t.jsonl", [FAILING, PASSING])), "--samples", "2")
    drain_with_a_worker(paths)
    first = {r["job_id"]: r for r in rows(paths)}
    failed = sorted(job for job, r in first.items() if r["status"] == "failed")
    assert len(failed) == 2 and len(first) == 4

    queued = cli("retry", run, "--failed")
    assert "2 job(s) in 1 group(s) queued again" in queued.stdout, queued.stdout
    record = retry_record(paths.root, queued.stdout)
    assert sorted(record["retries"].values()) == failed and record["jobs"] == 2
    tickets = list(queued_tickets(paths.init_queue))
    assert sorted(t.name for t in tickets) == sorted(record["retries"])
    for ticket in tickets:   # rebuilt from the row: the same task, sampling and group shape
        earlier = first[record["retries"][ticket.name]]
        assert ticket.job.instance == FAILING["instance"] and ticket.job.handler == "sleep"
        assert ticket.job.instance_id == earlier["instance_id"] and ticket.job.group_size == 2
        assert ticket.job.group_id != earlier["group_id"]

    again = cli("retry", run, "--failed", check=False)   # nothing new: the two are on their way again
    assert again.returncode == 1 and "2 such job(s) were retried already" in again.stderr, again.stderr
    assert len(list(queued_tickets(paths.init_queue))) == 2

    drain_with_a_worker(paths)
    second = {r["job_id"]: r for r in rows(paths)}
    assert len(second) == 6 and all(second[job]["status"] == "failed" for job in record["retries"])
    assert {job: second[job] for job in first} == first   # earlier rows untouched

    third = retry_record(paths.root, cli("retry", run, "--failed").stdout)
    assert sorted(third["retries"].values()) == sorted(record["retries"])   # the retries, not the originals

    shown = json.loads(cli("inspect", run, failed[0], "--json").stdout)
    chain = [a["job_id"] for a in shown["attempts"]]
    assert chain[0] == failed[0] and record["retries"][chain[1]] == failed[0] and third["retries"][chain[2]] == chain[1]
    assert [a.get("status") for a in shown["attempts"]] == ["failed", "failed", None]
    text = cli("inspect", run, chain[1]).stdout
    assert "attempts (hpc-rollout retry):" in text and f"2. {chain[1]}  status=failed" in text, text
    assert f"3. {chain[2]}  not finished" in text and "<- this job" in text


def test_named_jobs_and_whole_groups(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    run = str(paths.root)
    cli("submit", run, str(write_jsonl(tmp_path / "t.jsonl", [PASSING])), "--samples", "3")
    drain_with_a_worker(paths)
    jobs = sorted(r["job_id"] for r in rows(paths))

    one = retry_record(paths.root, cli("retry", run, jobs[1]).stdout)   # any finished job may be named
    assert list(one["retries"].values()) == [jobs[1]] and one["tasks"] == 1
    assert [t.job.group_size for t in queued_tickets(paths.init_queue)] == [1]

    whole = retry_record(paths.root, cli("retry", run, jobs[1], "--whole-groups").stdout)
    assert sorted(whole["retries"].values()) == jobs
    assert sorted(t.job.group_size for t in queued_tickets(paths.init_queue)) == [1, 3, 3, 3]

    unknown = cli("retry", run, jobs[0] + "x", check=False)
    assert unknown.returncode == 1 and "no finished row for" in unknown.stderr and "inspect" in unknown.stderr
    bare = cli("retry", run, check=False)
    assert bare.returncode == 2 and "--failed, --cancelled or job ids" in bare.stderr
