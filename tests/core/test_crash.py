"""Crashes and signals: SIGKILL loses no job and duplicates no row; SIGTERM/INT/USR2 drain cleanly."""

from __future__ import annotations

import json

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.submission.submit import submit_file
from tests.core.util import make_run, rows, start_worker, stop_worker, wait_drained, wait_until, write_jsonl


def claims_of(paths, process) -> int:
    return sum(len(os.listdir(d)) for d in paths.active.glob(f"*-{process.pid}-*") if d.is_dir())


def started_runs(paths) -> int:
    return sum(f.read_text().count('"event":"run_started"') for f in paths.events.glob("*.jsonl"))


def test_sigkill_mid_run_every_job_ends_exactly_once(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"shards.max_rows": 7})
    profile = {"init": 0.02, "run": {"uniform": [0.05, 0.4]}, "eval": 0.02, "seed": 3}
    submitted = submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": profile}] * 80))
    rng = random.Random(7)
    killed = 0
    victims = []
    steady = None
    try:
        for _ in range(3):  # a victim worker killed at a random moment, three times over
            victim = start_worker(paths, "--run-pool", "6", "--eval-pool", "2")
            victims.append(victim)
            wait_until(lambda: claims_of(paths, victim) > 0, 120, "the victim to hold claims")
            time.sleep(rng.uniform(0.0, 0.5))
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
            killed += 1
        # The steady worker comes last: started first, it could finish every job before a
        # slow-starting victim (a loaded machine) claimed any. It returns the victims' claims.
        steady = start_worker(paths, "--run-pool", "4")
        wait_drained(paths, timeout=120)
    finally:
        for victim in victims:  # a victim that never got claims must not outlive the test
            if victim.poll() is None:
                os.killpg(victim.pid, signal.SIGKILL)
                victim.wait()
        assert steady is None or stop_worker(steady) == 0
    got = rows(paths)
    counts = Counter(r["job_id"] for r in got)
    assert killed == 3
    assert len(counts) == submitted.jobs == 80, "a job was lost"
    assert max(counts.values()) == 1, f"duplicated rows: {[j for j, c in counts.items() if c > 1]}"
    assert {r["status"] for r in got} == {"ok"}
    assert any(r["attempt"] > 1 for r in got), "the killed workers' claims should come back with attempt + 1"
    assert not any(p.name.startswith(".reap-") for p in paths.active.iterdir())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR2])
def test_stop_signals_return_unfinished_work_and_exit_zero(tmp_path: Path, signum: int) -> None:
    paths = make_run(tmp_path / "run", **{"shutdown.grace_s": 0.5})
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 30}}] * 6))
    worker = start_worker(paths, "--run-pool", "3")
    wait_until(lambda: started_runs(paths) == 3, 30, "three jobs in RUN")
    os.killpg(worker.pid, signum)
    assert worker.wait(timeout=30) == 0
    # nothing lost, nothing claimed: every job is back in a queue, not counted as a failed attempt
    assert not any(any(d.iterdir()) for d in paths.active.iterdir() if d.is_dir())
    back = sorted(p.name for p in paths.init_queue.iterdir())
    assert len(back) == 6 and not rows(paths)
    # every job says so in its events, the 3 interrupted in RUN and the 3 prepared for it alike
    returned = [e for f in paths.events.glob("*.jsonl") for e in map(json.loads, f.read_text().splitlines())
                if e.get("event") == "returned"]
    assert sorted((e["stage"], e["to"]) for e in returned) == [("run", "init")] * 6, returned
    # a later worker finishes them once the durations allow
    for name in back:
        ticket = (paths.init_queue / name)
        data = ticket.read_bytes().replace(b'"run":30', b'"run":0.01')
        ticket.write_bytes(data)
    again = start_worker(paths)
    try:
        wait_drained(paths)
    finally:
        stop_worker(again)
    assert sorted(r["attempt"] for r in rows(paths)) == [1] * 6


def test_sigusr1_returns_running_jobs_at_once_despite_a_long_grace(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"shutdown.grace_s": 600})
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 30}}] * 2))
    worker = start_worker(paths)
    wait_until(lambda: started_runs(paths) == 2, 30, "two jobs in RUN")
    sent = time.monotonic()
    os.killpg(worker.pid, signal.SIGUSR1)
    assert worker.wait(timeout=30) == 0
    assert time.monotonic() - sent < 25, "the RUN stages were interrupted, not waited for"
    assert len(list(paths.init_queue.iterdir())) == 2 and not rows(paths)
    assert not any(any(d.iterdir()) for d in paths.active.iterdir() if d.is_dir())


def test_grace_period_lets_running_stages_finish(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"shutdown.grace_s": 20})
    submit_file(paths, write_jsonl(tmp_path / "t.jsonl", [{"handler": "sleep", "instance": {"run": 1.0}}] * 2))
    worker = start_worker(paths)
    wait_until(lambda: started_runs(paths) == 2, 30, "two jobs in RUN")
    os.killpg(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert sorted(r["status"] for r in rows(paths)) == ["ok", "ok"]
