"""Job timelines: per-worker event files read back by job and by event name."""

from __future__ import annotations

from pathlib import Path

from orchestrator.spool.events import EventLog, events_named, events_of
from tests.core.util import make_run


def test_events_are_found_by_name_and_by_job_across_workers(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    first, second = EventLog(paths, "w1"), EventLog(paths, "w2")
    first.emit("job-a", "claimed", {"stage": "init"})
    second.emit("job-b", "finished", {"status": "ok"})
    first.emit("job-a", "finished", {"status": "ok", "note": "finished"})  # the name inside a field too
    second.emit("job-c", "claimed_again")                               # a longer name is another event
    with open(paths.worker_events("w2"), "ab") as cut:
        cut.write(b'{"t": 1, "job": "job-d", "event": "fini')              # a line cut by a crash
    first.close()
    second.close()
    finished = events_named(paths, "finished")
    assert sorted(e["job"] for e in finished) == ["job-a", "job-b"]
    assert [e["event"] for e in events_named(paths, "claimed")] == ["claimed"]
    assert [e["event"] for e in events_of(paths, "job-a")] == ["claimed", "finished"]
