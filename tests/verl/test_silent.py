"""Nothing silent, through verl 0.9.1's own code (tests/verl/silent_run.py runs in verl's venv).

Real parts: verl's venv, its hydra config, its RayPPOTrainer._validate and compute_timing_metrics,
its DAPORewardManager and migrate_legacy_reward_impl; serve-llm --scripted over HTTP; a real
worker process in verl's venv, bubblewrap sandboxes for the `math` handler.

The missing grader is real, not simulated: verl's venv (scripts/verl-setup.sh) holds hpc-rollout's
runtime dependencies, not its extras, so math-verify is absent there and the `math` handler's EVAL
fails on it (MathVerifyMissing), as on a worker installed with a `[verl]` extra that lacked it.
The first test checks that precondition, so a venv that gains math-verify fails loudly, not vacuously.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.devserver.local_server import LocalServer, start_server
from orchestrator.devserver.tiny_model import tiny_model_dir
from tests.core.util import cli, make_run, stop_worker
from tests.verl.env import VerlEnv, verl_env

pytestmark = [pytest.mark.llm, pytest.mark.bwrap]

SCRIPTS = [{"match": "", "replies": ["The answer is \\boxed{7}."]}]


def rows(*sources: str) -> list[dict[str, Any]]:
    return [{"data_source": source, "prompt": [{"role": "user", "content": f"What is 3 + 4? ({i})"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "7"},
             "extra_info": {"split": "test", "index": i}} for i, source in enumerate(sources)]


def parquet(path: Path, table: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(table), path)
    return str(path)


@pytest.fixture(scope="module")
def verl(tmp_path_factory: pytest.TempPathFactory) -> VerlEnv:
    return verl_env(tmp_path_factory.mktemp("verl-env"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    scripts = tmp_path_factory.mktemp("scripts") / "scripts.json"
    scripts.write_text(json.dumps(SCRIPTS))
    scripted = start_server(threads=1, extra_args=("--scripted", str(scripts), "--logprobs-mode", "processed"))
    try:
        yield scripted
    finally:
        scripted.stop()


@pytest.fixture(scope="module")
def outcome(verl: VerlEnv, server: LocalServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("silent")
    paths = make_run(base / "run", **{"shards.max_age_s": 0.3, "shards.idle_flush_s": 0.05})
    cli("backend", "add", str(paths.root), server.url)
    custom = base / "score.py"
    custom.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    arguments = base / "args.json"
    arguments.write_text(json.dumps({
        "run": str(paths.root), "model": str(tiny_model_dir()), "custom": str(custom),
        "math_rows": parquet(base / "math.parquet", rows("math", "math")),
        "mixed_rows": parquet(base / "mixed.parquet", rows("math", "gsm8k")),
        "agent_rows": parquet(base / "agent.parquet", [{**row, "agent_name": "tool_agent"} for row in rows("gsm8k")])}))
    worker = verl.popen("-m", "orchestrator.worker", str(paths.root), "-v", log=paths.root / "worker.log")
    try:
        done = verl.run("-m", "tests.verl.silent_run", str(arguments), timeout=900)
    finally:
        stop_worker(worker)
    assert done.returncode == 0, f"silent_run failed:\n{done.stderr[-5000:]}"
    results: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    results["log"] = done.stderr
    results["worker_has_math_verify"] = verl.run(
        "-c", "import importlib.util as u; print(u.find_spec('math_verify') is not None)").stdout.strip()
    return results


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert "crashed" not in result, f"{result['crashed']}\n{result['traceback']}"
    return result


def test_a_batch_whose_grader_is_missing_raises_with_the_reason_instead_of_a_silent_zero(
        outcome: dict[str, Any]) -> None:
    assert outcome["worker_has_math_verify"] == "False", "verl's venv gained math-verify: the grader is not missing"
    failed = ok(outcome["validate"])["all_failed"]
    # verl's own _validate let it through: before, it logged val-core/math/reward/mean@1 = 0.0 and went on
    assert failed.get("error") == "AllSamplesFailed", failed
    message = failed["message"]
    assert message.startswith("all 2 samples of this batch failed (2 failed): first, job ")   # val n = 1
    assert "(handler 'math', data_source 'math'): MathVerifyMissing: the math handler needs the math-verify " \
           "package: pip install" in message
    assert "hpc-rollout inspect " in message and "\n" not in message
    # and which handler the rows went to, and why, once per data_source and manager: two managers
    # saw math (one per dataset), one saw gsm8k, in a validation and then a training call
    routes = [line for line in outcome["log"].splitlines() if "hpc-rollout: data_source" in line]
    assert sum("data_source 'math' -> handler 'math' (a handler of that name, before hpc_rollout.handler "
               "'answer'" in line for line in routes) == 2, routes
    assert sum("data_source 'gsm8k' -> handler 'answer' (hpc_rollout.handler" in line for line in routes) == 1, routes


def test_failed_samples_reach_the_metrics_verl_logs(outcome: dict[str, Any]) -> None:
    result = ok(outcome["validate"])
    validation = result["validation_metrics"]
    assert validation["val-aux/math/hpc_rollout_failed/mean@1"] == 1.0
    assert validation["val-aux/gsm8k/hpc_rollout_failed/mean@1"] == 0.0
    assert validation["val-core/gsm8k/reward/mean@1"] == 1.0       # the ok half still trains
    training = result["training_metrics"]
    assert training["timing_s/hpc_rollout/failed_share"] == 0.5
    assert training["timing_s/hpc_rollout/cancelled_share"] == training["timing_s/hpc_rollout/timed_out_share"] == 0.0
    assert "MathVerifyMissing" in result["hpc_rollout_meta"]["first_failure"]
    assert "2 of 4 samples masked (2 failed); first failure: job" in outcome["log"]


def test_verls_defaults_pass_and_each_changed_setting_is_applied_or_refused(outcome: dict[str, Any]) -> None:
    s = ok(outcome["settings"])
    assert s["default"] == {"reward": "handler", "custom": None, "overlong": None}
    assert s["custom"]["reward"] == "custom" and s["custom_legacy"]["reward"] == "custom"
    assert s["custom_but_handler"]["refused"].startswith("reward.custom_reward_function.path=")
    dapo = {"max_response_length": 64, "buffer": 16, "penalty_factor": 1.0, "log": True}
    assert s["dapo"]["overlong"] == s["dapo_legacy"]["overlong"] == dapo
    for name, named in (("reward_model", "+hpc_rollout.reward=custom"), ("reward_model_legacy", "+hpc_rollout.reward"),
                        ("manager_gdpo", "+hpc_rollout.reward=custom"), ("manager_legacy_remote", "+hpc_rollout.reward"),
                        ("manager_importlib", "+hpc_rollout.reward=custom"), ("overlong_without_dapo", "dapo"),
                        ("sandbox_fusion", "+hpc_rollout.reward=verl"), ("agent_loop", "+hpc_rollout.handler"),
                        ("agent_loop_config", "+hpc_rollout.source_handlers"), ("tools", "+hpc_rollout.source_handlers"),
                        ("function_tools", "+hpc_rollout.source_handlers"),
                        ("interaction", "+hpc_rollout.source_handlers")):
        assert named in s[name].get("refused", ""), (name, s[name])
    for name in ("custom_legacy", "reward_model_legacy", "manager_legacy_remote", "dapo_legacy"):
        migrated = dict(s[name].pop("after_verls_migration"))
        if "refused" in migrated:     # verl renames the key it moves; the decision is the same
            assert "refused" in s[name], name
        else:
            assert migrated == s[name], name


def test_the_overlong_penalty_is_verls_dapo_reward_manager_to_the_bit(outcome: dict[str, Any]) -> None:
    r = ok(outcome["overlong"])
    assert r["ours"] == r["verl"]
    assert r["ours_extra"]["overlong_reward"] == r["verl_extra"]["overlong_reward"]
    assert [float(x) for x in r["ours_extra"]["overlong"]] == r["verl_extra"]["overlong"]
    assert min(r["ours_extra"]["overlong_reward"]) < 0 < max(r["ours"]), "no penalty applied: the check is vacuous"


def test_rows_that_name_one_of_verls_agent_loops_are_refused_at_the_first_batch(outcome: dict[str, Any]) -> None:
    refused = ok(outcome["validate"])["agent_rows"]
    assert refused.get("error") == "VerlConfigError", refused
    assert refused["message"].startswith("rows name agent_name 'tool_agent' (verl's agent loops): ")
    assert "+hpc_rollout.source_handlers" in refused["message"]
