"""A step waiting on rows that do not come warns, naming the live workers or the command that starts
some (orchestrator/trainer/stall.py); rows coming keep it quiet."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from orchestrator.trainer.api import Spool
from orchestrator.trainer.tail import TRAINER_COLUMNS
from orchestrator.trainer.time_limit import GroupSlots, collect
from tests.core.util import FAST, start_worker, stop_worker, wait_until


def wait_for_step(spool: Spool, tasks: list[dict], limit_s: float, stall_after_s: float,
                  grace_s: float = 5.0) -> tuple[int, float]:
    """Submit `tasks` (sleep jobs) and collect them as a step does: (samples without a row, seconds)."""
    report = spool.submit(tasks, handler="sleep")
    placement = GroupSlots.of(report.submission_id, report.tasks, 1)
    reader = spool.reader(columns=TRAINER_COLUMNS, poll_s=0.05)
    started = time.monotonic()
    try:
        slots, _ = collect(reader, placement, report.jobs, spool.paths, lambda groups: spool.cancel(groups=groups),
                           limit_s, grace_s, 0.05, started, stall_after_s=stall_after_s)
    finally:
        reader.close()
    return sum(slot is None for slot in slots), time.monotonic() - started


def stall_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no new row" in r.getMessage()]


def test_a_step_with_no_worker_says_so_and_how_to_start_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool.create(tmp_path / "run", **FAST)
    with caplog.at_level(logging.WARNING):
        missing, _ = wait_for_step(spool, [{"run": 0}], limit_s=1.2, stall_after_s=0.2, grace_s=0.2)
    assert missing == 1
    warned = stall_warnings(caplog)
    # after 0.2, 0.4 and 0.8 s of silence: three times before the 1.2 s limit, not at every poll
    assert len(warned) == 3, warned
    assert "1 of 1 samples missing" in warned[0], warned
    assert f"no live worker on {spool.paths.root}" in warned[0], warned
    assert f"hpc-rollout launch {spool.paths.root} --local" in warned[0], warned


def test_a_step_held_by_live_workers_names_them_and_rows_keep_it_quiet(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool.create(tmp_path / "run", **FAST)
    worker = start_worker(spool.paths)
    try:
        wait_until(lambda: any(spool.paths.workers.glob("*.json")), what="the worker's heartbeat")
        with caplog.at_level(logging.WARNING):
            missing, _ = wait_for_step(spool, [{"run": 30}], limit_s=1.5, stall_after_s=0.5)
        assert missing == 0   # cancelled at the limit: a `cancelled` row
        warned = stall_warnings(caplog)
        assert warned and "1 live worker(s), but no row of the step" in warned[0], warned
        assert f"hpc-rollout status {spool.paths.root}" in warned[0], warned
        caplog.clear()
        # Rows every 0.2 s: each resets the silence, so a 0.5 s threshold never trips
        with caplog.at_level(logging.WARNING):
            missing, seconds = wait_for_step(spool, [{"run": 0.2 * (i + 1)} for i in range(6)], limit_s=60,
                                             stall_after_s=0.5)
        assert missing == 0 and seconds > 1.0
        assert stall_warnings(caplog) == []
    finally:
        stop_worker(worker)
