"""A file submitted again queues only what is new (issue 39: a partly rejected submission, fixed
and submitted again, queued its good rows twice); the same rejection on many rows is one line."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.spool.batches import queued_tickets
from orchestrator.submission.submit import submit_file
from tests.core.util import cli, make_run, write_jsonl

GOOD = [{"handler": "echo", "instance": {"x": n}} for n in range(3)]
UNMAPPED = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1+1?"}],
            "reward_model": {"ground_truth": "2"}}
FIXED = [{"handler": "echo", "instance": {"x": 10 + n}} for n in range(2)]


def queued_instances(paths) -> list[int]:
    return sorted(t.job.instance["x"] for t in queued_tickets(paths.init_queue))


def test_a_fixed_file_submitted_again_queues_only_the_rows_that_were_rejected(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [GOOD[0], UNMAPPED, GOOD[1], UNMAPPED, GOOD[2]])
    first = cli("submit", str(paths.root), str(tasks), "--samples", "2", "--json", check=False)
    assert first.returncode == 1
    # the same reason on lines 2 and 4: said once, with both lines
    reasons = [line for line in first.stderr.splitlines() if "names no handler" in line]
    assert len(reasons) == 1 and "lines 2, 4" in reasons[0], first.stderr
    assert queued_instances(paths) == [0, 0, 1, 1, 2, 2]
    first_id = json.loads(first.stdout)["submission_id"]

    write_jsonl(tasks, [GOOD[0], FIXED[0], GOOD[1], FIXED[1], GOOD[2]])   # the user fixes lines 2 and 4
    again = cli("submit", str(paths.root), str(tasks), "--samples", "2", "--json")
    report = json.loads(again.stdout)
    assert report["tasks"] == 2 and report["jobs"] == 4
    assert [(a["line"], a["submission_id"]) for a in report["already_submitted"]] == \
        [(1, first_id), (3, first_id), (5, first_id)]
    assert queued_instances(paths) == [0, 0, 1, 1, 2, 2, 10, 10, 11, 11]

    text = cli("submit", str(paths.root), str(tasks), "--samples", "2")   # all five queued by now: nothing new
    assert "0 task(s)" in text.stdout and "5 row(s) skipped as queued already" in text.stdout, text.stdout
    assert "lines 1, 3, 5" in text.stderr and "lines 2, 4" in text.stderr and "--again" in text.stderr, text.stderr
    assert len(queued_instances(paths)) == 10

    cli("submit", str(paths.root), str(tasks), "--samples", "2", "--again")
    assert len(queued_instances(paths)) == 20


def test_copies_within_one_file_and_submissions_through_the_api_are_all_queued(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [GOOD[0]] * 3)
    cli("submit", str(paths.root), str(tasks))
    assert queued_instances(paths) == [0, 0, 0]
    submit_file(paths, tasks)   # a trainer resubmits prompts on purpose
    assert queued_instances(paths) == [0] * 6


def test_the_same_rows_for_another_handler_or_at_another_temperature_are_new_tasks(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    bare = write_jsonl(tmp_path / "bare.jsonl", [{"init": 0.01}])
    cli("submit", str(paths.root), str(bare), "--handler", "echo")
    for options in (["--handler", "sleep"], ["--handler", "echo", "--sampling", "temperature=0.7"],
                    ["--handler", "echo", "--samples", "2"]):
        again = json.loads(cli("submit", str(paths.root), str(bare), *options, "--json").stdout)
        assert again["tasks"] == 1 and "already_submitted" not in again, options
