"""The trainer-facing API: submit, read complete groups with a resumable cursor."""

from __future__ import annotations

from pathlib import Path

from orchestrator.trainer.api import Spool
from tests.core.util import FAST, start_worker, stop_worker, wait_drained


def test_groups_and_cursor(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path / "run", **FAST, **{"shards.max_rows": 3})
    report = spool.submit([{"reward": 0.5}, {"reward": 1.0}], handler="echo", samples=4)
    assert report.jobs == 8
    worker = start_worker(spool.paths)
    try:
        wait_drained(spool.paths)
    finally:
        stop_worker(worker)
    reader = spool.reader()
    groups = list(reader.groups())
    assert len(groups) == 2
    for group in groups:
        assert [r["sample_index"] for r in group] == [0, 1, 2, 3] and len({r["group_id"] for r in group}) == 1
    assert reader.cursor is not None and list(spool.reader(reader.cursor).rows()) == []
    assert spool.status().finished == {"ok": 8}
