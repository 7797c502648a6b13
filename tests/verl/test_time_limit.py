"""verl's rollout under `time_limit_s`: the first step starts warm, and a step cut at its limit
leaves nothing running when generate_sequences returns (issue 35, items 4 and 7).

Real parts: SpoolLoopManager in verl's venv, built by `create()` as verl does
(tests/verl/time_limit_driver.py), a fresh worker process, serve-llm --tiny over HTTP. At each
return the driver reads what verl would put to sleep next: serve-llm's /metrics, the spool's
claims and pending jobs. The same on stock vLLM: tests/vllm/test_time_limit.py. Without verl:
the grace's bound (a paused worker holds the cut jobs) and its setting's bounds.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.registry import BackendRegistry
from orchestrator.spool.paths import SpoolPaths
from orchestrator.trainer.api import Spool
from orchestrator.trainer.verl.settings import VerlConfigError, parse_settings
from orchestrator.trainer.time_limit import GroupSlots, collect
from tests.core.util import FAST, make_run, start_worker, stop_worker, wait_until
from tests.verl.env import VerlEnv, verl_env

pytestmark = pytest.mark.llm

# A warm step of 8 short samples takes well under a second here; a fresh worker's first job
# imports transformers and loads the tokenizer first (4-15 s measured): a limit sized on warm
# steps cancelled the whole first batch before create() warmed the workers.
WARM_LIMIT_S = 3.0
CUT_LIMIT_S, GRACE_S = 4.0, 10.0
# Seconds of sampling: only the cut ends these. 1,500 tokens (in a 2,048 context) lasted 4-5 s
# until serve-llm batched rows as `generate` does; then all 8 finished before a 4 s cut in CI.
MAX_MODEL_LEN = 4096   # the tiny model's max_position_embeddings
LONG = {"max_tokens": 3900, "ignore_eos": True}


def scenarios() -> list[dict[str, Any]]:
    return [
        {"name": "first_step", "prompts": 4, "samples": 2, "response_length": 16, "time_limit_s": WARM_LIMIT_S},
        {"name": "cut", "prompts": 4, "samples": 2, "response_length": 64, "time_limit_s": CUT_LIMIT_S,
         "cancel_grace_s": GRACE_S, "sampling": LONG},
    ]


def train_file(base: Path) -> str:
    """verl's data.train_files: what create() takes its warm-up rows from."""
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + 2?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + 2)},
             "extra_info": {"index": i}} for i in range(4)]
    path = base / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def drive(verl: VerlEnv, paths: SpoolPaths, url: str, base: Path, chosen: list[dict[str, Any]]) -> dict[str, Any]:
    """The driver on `chosen` scenarios against a fresh worker; its figures."""
    arguments = base / "time-limit.json"
    arguments.write_text(json.dumps({"run": str(paths.root), "url": url, "model": str(tiny_model_dir()),
                                     "train_files": train_file(base), "scenarios": chosen}))
    worker = start_worker(paths)
    try:
        done = verl.run("-m", "tests.verl.time_limit_driver", str(arguments), timeout=600)
    finally:
        stop_worker(worker)
    assert done.returncode == 0, f"driver failed:\n{done.stderr[-5000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    started = start_server(threads=1, extra_args=("--logprobs-mode", "processed",
                                                  "--max-model-len", str(MAX_MODEL_LEN)))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def figures(server: LocalServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("time-limit")
    paths = make_run(base / "run", **{"shards.max_age_s": 0.3, "shards.idle_flush_s": 0.05})
    BackendRegistry.of(paths).add(server.url, logprob_mode="processed", tokenizer=str(tiny_model_dir()))
    return drive(verl_env(base / "verl-env"), paths, server.url, base, scenarios())


def test_the_first_step_runs_warm_under_a_limit_sized_on_warm_steps(figures: dict[str, Any]) -> None:
    [first] = figures["first_step"]["calls"]
    assert first["ok"] == 8, f"the first step was cut: {first}"       # before: 0 ok, 8 cancelled
    assert first["seconds"] < WARM_LIMIT_S and first["time_limit"] is None
    assert figures["first_step"]["create_s"] > first["seconds"]       # the cold start was paid in create()


def test_a_step_cut_at_its_limit_leaves_nothing_running_when_it_returns(figures: dict[str, Any]) -> None:
    [cut] = figures["cut"]["calls"]
    assert cut["busy_at_return"] == 0, f"serve-llm still generating at the return: {cut}"
    assert cut["held"] == [] and cut["pending"] == 0
    assert cut["seconds"] < CUT_LIMIT_S + 3.0
    assert cut["cancelled"] == 8 and cut["missing"] == 0
    said = cut["time_limit"]                                         # what was cut, in meta_info
    assert said["limit_s"] == CUT_LIMIT_S and said["grace_s"] == GRACE_S
    assert (said["cancelled_groups"], said["cancelled_samples"], said["missing"], said["left_behind"]) == (4, 8, 0, [])
    assert 0 <= said["gone_after_s"] < GRACE_S


@pytest.mark.parametrize("grace", [-1, 4000, "30"])
def test_the_grace_is_bounded_and_named_when_refused(tmp_path: Path, grace: Any) -> None:
    config = {"hpc_rollout": {"spool": str(tmp_path), "cancel_grace_s": grace}}
    with pytest.raises(VerlConfigError, match=r"hpc_rollout.cancel_grace_s must be a number in \[0, 3600\]"):
        parse_settings(config)
    assert parse_settings({"hpc_rollout": {"spool": str(tmp_path), "cancel_grace_s": 0}}).cancel_grace_s == 0.0
    assert parse_settings({"hpc_rollout": {"spool": str(tmp_path)}}).cancel_grace_s == 30.0


def test_a_grace_that_runs_out_returns_on_time_and_names_what_it_left_behind(tmp_path: Path) -> None:
    """The bounded grace, for real: the worker holding the step's jobs is paused (SIGSTOP), so the
    cancel reaches nobody; the cut returns at limit + grace and names the claims still held."""
    spool = Spool.create(tmp_path / "run", **FAST)
    report = spool.submit([{"run": 600.0}, {"run": 600.0}], handler="sleep", samples=2)
    placement = GroupSlots.of(report.submission_id, tasks=2, samples=2)
    worker = start_worker(spool.paths)
    claims = spool.paths.active
    try:
        wait_until(lambda: any(p.name.startswith(report.submission_id) for p in claims.glob("*/*")), 60, "the claims")
        os.killpg(worker.pid, signal.SIGSTOP)
        began = time.monotonic()
        with spool.reader(columns=["group_id", "sample_index", "status"], poll_s=0.05) as reader:
            slots, cut = collect(reader, placement, 4, spool.paths, lambda groups: spool.cancel(groups=groups),
                                 limit_s=0.5, grace_s=2.0, poll_s=0.05, started=began)
        took = time.monotonic() - began
    finally:
        os.killpg(worker.pid, signal.SIGCONT)
        stop_worker(worker)
    assert cut is not None and 2.5 <= took < 4.0
    assert slots == [None] * 4 and (cut.groups, cut.samples, cut.missing, cut.gone_after_s) == (2, 4, 4, None)
    assert cut.left_behind and all(entry.startswith("active/") and report.submission_id in entry
                                   for entry in cut.left_behind)
