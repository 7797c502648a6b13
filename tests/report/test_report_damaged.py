"""A spool with a corrupt shard, a truncated shard, a missing event file and a line cut by a
crash still gets its page; the page and the summary name what was skipped."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq

from orchestrator.submit import submit_rows
from tests.core.util import cli, make_run
from tests.report.expected import direct_numbers
from tests.report.test_report_run import FIGURES


def test_report_names_what_it_could_not_read(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"shards.max_rows": 5})
    tasks = [(i, {"handler": "sleep", "instance": {"run": 0.02, "fail": {"run": 0.3}, "reward": i % 2}}) for i in range(1, 13)]
    tasks += [(13 + i, {"handler": "echo", "instance": {"i": i}}) for i in range(8)]
    submit_rows(paths, tasks, samples=2)
    cli("launch", str(paths.root), "--local", "--workers", "2", "--wait", timeout=300)
    shards = sorted(paths.shards.glob("*.parquet"))
    assert len(shards) >= 3
    truncated, kept = shards[0], shards[1:]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    (paths.shards / "9999999999999-garbage-000001.parquet").write_bytes(b"not parquet at all")
    event_files = sorted(paths.events.glob("*.jsonl"))
    assert len(event_files) == 2
    lost_worker = event_files[0].stem
    event_files[0].unlink()
    with open(event_files[1], "ab") as handle:
        handle.write(b'{"t": 1, "job": "x", "event": "run_sta')

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
    for item in skipped:
        assert item.replace("'", "&#39;").replace('"', "&#34;") in page or item in page
        assert f"skipped: {item}" in made.stdout
    rows = [row for shard in kept for row in pq.read_table(shard).to_pylist()]
    numbers = orjson.loads((paths.root / "report" / "numbers.json").read_bytes())["finished"]
    expected = direct_numbers(rows)
    assert numbers["jobs"] == expected["jobs"] == len(rows) and numbers["by_status"] == expected["by_status"]
