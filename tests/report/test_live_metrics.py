"""Live metrics from the workers: each worker logs its own scalars at its heartbeats to TensorBoard
(one event directory per worker) and to W&B (one run per worker, grouped by the rollout run)."""

from __future__ import annotations

import logging
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.config import ConfigError, RunConfig
from orchestrator.metrics.live import LiveMetrics
from orchestrator.metrics.recent import RecentJobs
from orchestrator.report.status import pending_count
from orchestrator.submission.submit import submit_rows
from tests.core.util import make_run, start_worker, stop_worker, wait_drained, wait_until

JOBS = 30


def _jobs(count: int, seconds: float) -> list[tuple[int, dict[str, Any]]]:
    """Sleep jobs rewarded 1 and 0 in turn: reward mean and pass rate 0.5."""
    return [(i, {"handler": "sleep", "instance": {"run": seconds, "reward": i % 2}}) for i in range(count)]


def _scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not directory.is_dir():
        return {}
    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_each_worker_writes_tensorboard_scalars_while_the_run_goes(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"metrics.tensorboard_dir": "tb", "pools.run": 3})
    submit_rows(paths, _jobs(JOBS, 0.3))
    directory = paths.root / "tb" / paths.root.name / "w1"
    worker = start_worker(paths, "--worker-id", "w1")
    try:
        wait_until(lambda: "jobs/finished" in _scalars(directory), 60, "the worker's first scalars")
        assert pending_count(paths) > 0, "scalars are readable while jobs are still pending"
        wait_drained(paths)
        wait_until(lambda: _scalars(directory)["jobs/finished"][-1][1] == JOBS, 30, "the final count")
    finally:
        assert stop_worker(worker) == 0
    scalars = _scalars(directory)
    finished = scalars["jobs/finished"]
    assert len(finished) >= 3 and [step for step, _ in finished] == sorted({step for step, _ in finished})
    assert [value for _, value in finished] == sorted(value for _, value in finished)
    assert finished[-1][1] == JOBS and scalars["jobs/failed"][-1][1] == 0
    assert scalars["pool/run_size"][-1][1] == 3 and max(v for _, v in scalars["pool/run_busy"]) >= 1
    assert scalars["last_minute/reward_mean"][-1][1] == pytest.approx(0.5)
    assert scalars["last_minute/pass_rate"][-1][1] == pytest.approx(0.5)
    assert max(v for _, v in scalars["last_minute/jobs_per_s"]) > 0
    assert scalars["last_minute/run_p50_s"][-1][1] == pytest.approx(0.3, abs=0.25)
    assert "tokens/sampled" in scalars


def _wandb_records(path: Path) -> Iterator[Any]:
    """The records of a .wandb file: a 7-byte header, then LevelDB-log records in 32 KiB blocks
    (each: crc32, length, type; type 1 whole, 2-4 first/middle/last piece)."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, pieces = path.read_bytes(), 32 * 1024, 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:   # a block's tail too short for a header is padding
            position += block - position % block
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        if kind == 0:
            return
        pieces += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def _wandb_run(directory: Path) -> tuple[Any, dict[str, list[float]]]:
    """The run record of the one offline run under `directory` and its history, key -> values."""
    [path] = directory.glob("wandb/offline-run-*/run-*.wandb")
    run, history = None, {}
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)   # W&B may store "a/b" as nested keys
                history.setdefault(key, []).append(float(item.value_json))
    return run, history


def test_each_worker_is_a_wandb_run_grouped_by_the_rollout_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    paths = make_run(tmp_path / "run", **{"metrics.wandb_project": "hpc-rollout-test", "metrics.wandb_mode": "offline"})
    submit_rows(paths, _jobs(10, 0.05))
    env = {"WANDB_DIR": str(tmp_path / "wandb-dir"), "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "config"),
           "WANDB_MODE": "online"}   # run.toml's mode wins over the environment's
    (tmp_path / "wandb-dir").mkdir()
    worker = start_worker(paths, "--worker-id", "w1", env=env)
    try:
        wait_drained(paths)
        time.sleep(1.5)   # a beat after the last job
    finally:
        assert stop_worker(worker) == 0
    run, history = None, {}
    deadline = time.monotonic() + 30   # W&B's writer process may flush after the worker exits
    while time.monotonic() < deadline and (run is None or history.get("jobs/finished", [0])[-1] != 10):
        run, history = _wandb_run(tmp_path / "wandb-dir")
        time.sleep(0.2)
    assert run is not None and run.display_name == "w1" and run.run_group == paths.root.name
    assert run.project == "hpc-rollout-test"
    assert len(history["jobs/finished"]) >= 2 and history["jobs/finished"][-1] == 10
    assert history["last_minute/reward_mean"][-1] == pytest.approx(0.5)
    assert history["pool/run_size"][-1] == RunConfig().pools.run


@pytest.mark.parametrize(("setting", "module", "extra"), [
    ("metrics.tensorboard_dir=tb", "tensorboard", "hpc-rollout[tensorboard]"),
    ("metrics.wandb_project=p", "wandb", "hpc-rollout[wandb]"),
])
def test_a_missing_package_stops_the_worker_at_start_with_the_pip_install(
        tmp_path: Path, setting: str, module: str, extra: str) -> None:
    key, _, value = setting.partition("=")
    paths = make_run(tmp_path / "run", **{key: value})
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from orchestrator.worker.__main__ import main\n"
            f"sys.argv = ['worker', {str(paths.root)!r}, '--idle-exit', '1']\nmain()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"pip install '{extra}'" in done.stderr and key.split(".")[1] in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_the_live_metrics_settings_are_checked() -> None:
    config = RunConfig()
    assert (config.metrics.tensorboard_dir, config.metrics.wandb_project, config.metrics.wandb_mode) == ("", "", "")
    changed = config.with_overrides({"metrics.tensorboard_dir": "/scratch/tb", "metrics.wandb_project": "rl",
                                     "metrics.wandb_mode": "offline"})
    assert changed.metrics.wandb_mode == "offline" and changed.metrics.tensorboard_dir == "/scratch/tb"
    with pytest.raises(ConfigError, match="metrics.wandb_mode = 'sometimes'; valid: .*online, offline"):
        config.with_overrides({"metrics.wandb_mode": "sometimes"})


class _Failing:
    def __init__(self) -> None:
        self.calls = 0

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        raise OSError(5, "Input/output error")


def test_a_failing_writer_never_stops_the_worker_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    sink = _Failing()
    live = LiveMetrics([sink], RecentJobs(), every_s=0.0)
    info = {"state": "running", "counters": {"finished": 1}, "pools": {"run": {"busy": 1, "size": 2}}}
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            live.write(info)
        live.close()
    assert sink.calls == 3
    assert len([r for r in caplog.records if "No space left" in r.getMessage()]) == 1, caplog.text
