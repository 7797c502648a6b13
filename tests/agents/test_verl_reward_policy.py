"""A row cannot pick the code its reward runs: verl's custom reward function is the operator's.

`verl_reward: {"source": "custom"}` in a row selects the function run.toml `[rewards]` names
(`verl_custom_path`, `verl_custom_name`); a row naming a file of its own is refused at `submit`
with FILE:LINE, and a job that reaches EVAL with one (a ticket planted without `submit`) fails
without the file being imported. The operator's function itself runs in a scorer sandbox, never on
the worker (tests/agents/test_verl_scorer_sandbox.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hpc_rollout.handlers.answer import AnswerHandler
from orchestrator.config import Rewards
from orchestrator.grading.verl_reward import VerlRewardError
from orchestrator.handler_api.context import JobContext, WorkerServices
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.submission.submit import submit_rows
from orchestrator.spool.paths import SpoolPaths
from tests.agents.conftest import needs_bwrap
from tests.core.util import make_run

REWARD = '''
from pathlib import Path
try:
    Path({marker!r}).write_text("imported")   # on the host only if it is imported there
except OSError:
    pass

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {{"score": 1.0 if ground_truth in solution_str else 0.0, "bonus": kwargs.get("bonus", 0)}}
'''


def reward_file(tmp_path: Path, name: str) -> tuple[Path, Path]:
    marker = tmp_path / f"{name}.imported"
    path = tmp_path / f"{name}.py"
    path.write_text(REWARD.format(marker=str(marker)))
    return path, marker


def gsm8k_row(spec: dict[str, Any]) -> dict[str, Any]:
    return {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "2+2?"}],
            "reward_model": {"style": "rule", "ground_truth": "4"}, "verl_reward": spec}


def evaluate(instance: dict[str, Any], rewards: Rewards, reply: str, paths: SpoolPaths | None = None,
             runtime: str = "local") -> dict[str, Any]:
    job = JobSpec(job_id="s-0000000-0000", group_id="s-0000000", instance_id="i", sample_index=0,
                  handler="answer", instance=instance)
    services = WorkerServices(paths=paths, worker_id="w", node="n", runtime=runtime, rewards=rewards)  # type: ignore[arg-type]
    ctx = JobContext(job=job, stage=Stage.EVAL, attempt=1, services=services)
    return asyncio.run(AnswerHandler().eval(ctx, {"reply": reply}))


def test_a_row_naming_its_own_reward_file_is_refused_at_submit(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    path, marker = reward_file(tmp_path, "rows_own")
    report = submit_rows(paths, [(3, {"handler": "answer", "instance": gsm8k_row(
        {"source": "custom", "path": str(path), "name": "compute_score"})})], source="train.jsonl")
    assert report.jobs == 0
    [rejected] = report.rejected
    assert rejected.line == 3 and "run.toml [rewards] verl_custom_path" in rejected.reason, rejected.reason
    assert not marker.exists()


def test_a_planted_job_naming_a_reward_file_fails_at_eval_without_importing_it(tmp_path: Path) -> None:
    path, marker = reward_file(tmp_path, "planted")
    instance = gsm8k_row({"source": "custom", "path": str(path)})
    with pytest.raises(VerlRewardError, match=r"run.toml \[rewards\] verl_custom_path"):
        evaluate(instance, Rewards(), "4")
    assert not marker.exists()


def test_custom_without_an_operator_function_fails_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(VerlRewardError, match=r"run.toml \[rewards\] verl_custom_path"):
        evaluate(gsm8k_row({"source": "custom"}), Rewards(), "4")


@needs_bwrap
def test_the_operators_function_scores_with_the_rows_kwargs_in_its_sandbox(tmp_path: Path) -> None:
    path, marker = reward_file(tmp_path, "operator")
    rewards = Rewards(verl_custom_path=str(path), verl_custom_name="compute_score")
    scored = evaluate(gsm8k_row({"source": "custom", "reward_kwargs": {"bonus": 2}}), rewards, "it is 4",
                      paths=make_run(tmp_path / "run"), runtime="bwrap")
    assert scored["reward"] == 1.0 and scored["reward_extra_info"]["bonus"] == 2
    assert not marker.exists()   # imported in the scorer sandbox only
