"""A spool with a corrupt shard, a truncated shard, a missing event file and a line cut by a
crash still gets its page; the page and the summary name what was skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from orchestrator.spool import fsops
from orchestrator.submission.submit import submit_rows
from tests.core.util import cli, drain_with_a_worker, make_run, start_worker, stop_worker, wait_drained
from tests.report.expected import direct_numbers
from tests.report.test_report_run import FIGURES


def test_report_names_what_it_could_not_read(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"shards.max_rows": 5})
    sleeps = [(i, {"handler": "sleep", "instance": {"run": 0.02, "fail": {"run": 0.3}, "reward": i % 2}}) for i in range(1, 13)]
    echoes = [(i, {"handler": "echo", "instance": {"i": i}}) for i in range(1, 9)]
    # One after the other: each writes rows and events, and its clean stop commits its own shard,
    # so there are three shards whatever the timing (max_rows triggers a commit, it does not split one).
    for worker_id, tasks in (("w1", sleeps[:6]), ("w2", echoes), ("w3", sleeps[6:])):
        submit_rows(paths, tasks, samples=2)
        worker = start_worker(paths, "--worker-id", worker_id)
        try:
            wait_drained(paths)
        finally:
            assert stop_worker(worker) == 0
    shards = sorted(paths.shards.glob("*.parquet"))
    assert len(shards) >= 3
    truncated, kept = shards[0], shards[1:]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    (paths.shards / "9999999999999-garbage-000001.parquet").write_bytes(b"not parquet at all")
    event_files = sorted(paths.events.glob("*.jsonl"))
    assert len(event_files) == 3
    lost_worker = event_files[2].stem   # w3: its rows are readable, its events gone
    event_files[2].unlink()
    with open(event_files[1], "ab") as handle:
        handle.write(b'{"t": 1, "job": "x", "event": "run_sta')
    broken_ticket = paths.tmp / "20990101T000000000-dead-0000000-0000"
    broken_ticket.write_text("{not a ticket")
    moved = fsops.quarantine(broken_ticket, paths.quarantine, "ticket is not JSON")

    made = cli("report", str(paths.root))
    page = (paths.root / "report" / "report.html").read_text()
    for name in FIGURES:
        assert (paths.root / "report" / name).stat().st_size > 1000
    skipped = orjson.loads((paths.root / "report" / "numbers.json").read_bytes())["skipped"]
    named = "\n".join(skipped)
    assert f"shards/{truncated.name}" in named and "shards/9999999999999-garbage-000001.parquet" in named
    assert f"no events from worker {lost_worker}" in named
    assert f"events/{event_files[1].name}: 1 unreadable line(s) skipped" in named
    assert "finished job(s) have no events" in named
    assert f"quarantine/{moved.name}: ticket is not JSON" in named
    for item in skipped:
        assert item.replace("'", "&#39;").replace('"', "&#34;") in page or item in page
        assert f"skipped: {item}" in made.stdout
    rows = [row for shard in kept for row in pq.read_table(shard).to_pylist()]
    numbers = orjson.loads((paths.root / "report" / "numbers.json").read_bytes())["finished"]
    expected = direct_numbers(rows)
    assert numbers["jobs"] == expected["jobs"] == len(rows) and numbers["by_status"] == expected["by_status"]


def test_since_open_and_bad_input(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    submit_rows(paths, [(i, {"handler": "echo", "instance": {"i": i}}) for i in range(1, 7)])
    cli("launch", str(paths.root), "--local", "--workers", "1", "--wait", timeout=300)
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f"#!/bin/sh\necho \"$1\" > {opened}\n")
    browser.chmod(0o755)
    env = {**os.environ, "BROWSER": str(browser)}
    done = subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", "report", str(paths.root),
                           "--since", "1h", "--open"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    page = paths.root / "report" / "report.html"
    assert opened.read_text().strip() == page.as_uri()
    assert orjson.loads((paths.root / "report" / "numbers.json").read_bytes())["finished"]["jobs"] == 6
    assert "window: the last 1h" in page.read_text()

    cli("report", str(paths.root), "--since", "0.001", "--out", str(tmp_path / "empty"))
    numbers = orjson.loads((tmp_path / "empty" / "numbers.json").read_bytes())
    assert numbers["finished"]["jobs"] == 0   # every row finished more than a millisecond ago
    assert all((tmp_path / "empty" / name).stat().st_size > 1000 for name in FIGURES)

    bad = cli("report", str(paths.root), "--since", "soon", check=False)
    assert bad.returncode == 2 and "duration 'soon' not understood: use e.g. 90s, 30m, 1h" in bad.stderr
    not_a_run = cli("report", str(tmp_path), check=False)
    assert not_a_run.returncode == 1 and "hpc-rollout init" in not_a_run.stderr


def test_report_replaces_planted_links_and_leaves_their_targets_untouched(tmp_path: Path) -> None:
    """Every file of report/ is written new and renamed over: a link planted in its place is
    replaced, what it pointed at is not written through (savefig alone follows links)."""
    paths = make_run(tmp_path / "run")
    # Every other job fails for sure: a fail probability of 0.5 left all six ok in 1 run of 64
    # (the draw is seeded by the job id, new each run), and no failed job means no example file.
    submit_rows(paths, [(i, {"handler": "sleep", "instance": {"run": 0.01, "fail": {"run": float(i % 2)}}})
                        for i in range(1, 7)])
    drain_with_a_worker(paths)
    out = paths.root / "report"
    (out / "jobs").mkdir(parents=True)
    victims = tmp_path / "victims"
    victims.mkdir()
    planted = {}
    for name in [*FIGURES, "report.html", "numbers.json"]:
        victim = victims / name.replace("/", "_")
        victim.write_text(f"precious {name}\n")
        (out / name).symlink_to(victim)
        planted[name] = victim
    cli("report", str(paths.root))
    examples = sorted((out / "jobs").glob("*.json"))
    assert examples, "the failed jobs should have example files"
    for name, victim in planted.items():
        assert victim.read_text() == f"precious {name}\n", f"report wrote through the link report/{name}"
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 100, name
    # A second report with links planted at the example files, and at the jobs/ directory itself.
    for example in examples:
        victim = victims / example.name
        victim.write_text("precious example\n")
        example.unlink()
        example.symlink_to(victim)
    cli("report", str(paths.root))
    for example in examples:
        assert (victims / example.name).read_text() == "precious example\n"
        assert not example.is_symlink()
    (out / "jobs").rename(out / "jobs-before")
    (out / "jobs").symlink_to(victims)
    refused = cli("report", str(paths.root), check=False)
    assert refused.returncode == 1 and "report/jobs is a symbolic link" in refused.stderr, refused.stderr
    assert sorted(p.name for p in victims.iterdir()) == sorted([*(v.name for v in planted.values()),
                                                                *(e.name for e in examples)])
