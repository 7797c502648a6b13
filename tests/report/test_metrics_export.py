"""Metrics for other tools: a Prometheus text file per worker (node-exporter textfile collector),
and trainer-side hooks writing the rollout numbers to W&B (offline) and TensorBoard."""

from __future__ import annotations

import time

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.trainer.api import Spool
from orchestrator.metrics.hooks import TensorBoardHook, WandbHook, rollout_metrics
from orchestrator.spool.paths import SpoolPaths
from orchestrator.report.status import pending_count
from orchestrator.submission.submit import submit_rows
from tests.core.util import make_run, start_worker, stop_worker, wait_drained, wait_until
from tests.report.expected import all_rows, direct_numbers


def _families(path: Path) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(path.read_text())}


def test_each_worker_keeps_a_complete_prom_file_while_it_runs(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"metrics.prometheus_dir": "prom", "pools.run": 3})
    directory = paths.root / "prom"
    submit_rows(paths, [(i, {"handler": "sleep", "instance": {"run": 0.05}}) for i in range(1, 41)])
    worker = start_worker(paths, "--worker-id", "w1")
    seen = 0
    try:
        wait_until(lambda: any(directory.glob("*.prom")), 60, "the worker's .prom file")
        path = directory / f"hpc_rollout-{paths.root.name}-w1.prom"
        while not wait_drained_now(paths) or seen < 5:
            # What node-exporter would read at any moment: only whole *.prom files.
            for found in directory.glob("*.prom"):
                families = _families(found)
                assert families["hpc_rollout_pool_slots"] and families["hpc_rollout_worker_up"]
                seen += 1
        wait_drained(paths)
        wait_until(lambda: _families(path)["hpc_rollout_jobs_finished"][0].value == 40, 30, "the final counters")
        families = _families(path)
        slots = {s.labels["stage"]: s.value for s in families["hpc_rollout_pool_slots"]}
        assert slots["run"] == 3
        sample = families["hpc_rollout_jobs_finished"][0]
        assert sample.labels == {"run": paths.root.name, "worker": "w1", "node": sample.labels["node"]}
        assert families["hpc_rollout_heartbeat_timestamp_seconds"][0].value > 0
    finally:
        assert stop_worker(worker) == 0
    assert not list(directory.iterdir()), "a stopped worker removes its file"


def wait_drained_now(paths: SpoolPaths) -> bool:
    return pending_count(paths) == 0


@pytest.fixture(scope="module")
def finished_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    paths = make_run(tmp_path_factory.mktemp("hooks") / "run")
    spool = Spool.open(paths.root)
    spool.submit([{"handler": "sleep", "instance": {"run": 0.01, "reward": i % 3 == 0}} for i in range(6)], samples=2)
    worker = start_worker(paths)
    try:
        wait_drained(paths)
        wait_until(lambda: any(paths.shards.glob("*.parquet")) and len(all_rows(paths)) == 12, 30, "rows")
    finally:
        stop_worker(worker)
    return [row for group in spool.reader().groups() for row in group]


def test_rollout_metrics_are_the_status_numbers(finished_rows: list[dict]) -> None:
    metrics = rollout_metrics(finished_rows)
    expected = direct_numbers(finished_rows)
    assert metrics["rollout/jobs"] == 12 and metrics["rollout/status/ok"] == 12
    assert metrics["rollout/reward_mean"] == pytest.approx(expected["reward_mean"])
    assert metrics["rollout/pass_rate"] == pytest.approx(expected["pass_rate"])
    assert metrics["rollout/latency/run_p50_s"] == pytest.approx(expected["latency"]["run"]["p50"])


def test_tensorboard_hook_writes_scalars(tmp_path: Path, finished_rows: list[dict]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with TensorBoardHook(tmp_path / "tb") as hook:
        first = hook.log_rows(finished_rows[:6], step=1)
        second = hook.log_rows(finished_rows, step=2)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("rollout/reward_mean")]
    assert logged == [(1, pytest.approx(first["rollout/reward_mean"])), (2, pytest.approx(second["rollout/reward_mean"]))]


def test_wandb_hook_works_offline(tmp_path: Path, finished_rows: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with WandbHook(project="hpc-rollout-test", mode="offline", directory=tmp_path) as hook:
        metrics = hook.log_rows(finished_rows, step=3)
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    # wandb's writer process flushes the run file on its own time (seen: only the header right
    # after finish() on a loaded machine): give it a while.
    deadline = time.monotonic() + 60
    while b"rollout/reward_mean" not in (data := runs[0].read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    # The run file holds each history item as its key and JSON value (protobuf strings, uncompressed).
    assert b"rollout/reward_mean" in data and repr(metrics["rollout/reward_mean"]).encode() in data
