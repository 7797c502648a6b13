"""The verl manager's parts that need no verl: the config block, the assembly by hand, the versions.

Runs in the main environment, where verl is not installed: importing the package, its keys, its
settings and the handlers that can call verl's reward functions must not import verl.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.config import Rewards
from orchestrator.grading.scorer_sandbox import ScorerSandboxError
from orchestrator.grading.verl_reward import VerlRewardError, check_spec, score_with_verl
from orchestrator.handler_api.context import JobContext, WorkerServices
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import current_node
from orchestrator.trainer import verl_keys as keys
from orchestrator.trainer.verl.assemble import assemble
from orchestrator.trainer.verl.servers import policy_version_of
from orchestrator.trainer.verl.settings import RewardSource, VerlConfigError, parse_settings
from tests.core.util import make_run


def config(**block: Any) -> dict[str, Any]:
    return {"actor_rollout_ref": {"rollout": {"n": 4, "prompt_length": 8, "response_length": 6, "temperature": 0.7,
                                              "logprobs_mode": "processed_logprobs"},
                                  "model": {"path": "/models/tiny"}},
            "hpc_rollout": {"spool": "/scratch/run1", **block}}


def test_importing_the_manager_package_and_the_handlers_does_not_import_verl() -> None:
    code = ("import sys, orchestrator.trainer.verl, orchestrator.trainer.verl_keys, orchestrator.trainer.verl.settings, "
            "orchestrator.trainer.verl.assemble, hpc_rollout.handlers.answer, hpc_rollout.handlers.chat, "
            "orchestrator.trainer; print(sorted(m for m in sys.modules if m.split('.')[0] in ('verl', 'ray', 'tensordict')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr or done.stdout


def test_the_config_block_is_read_with_verls_rollout_settings_and_bad_values_are_refused() -> None:
    settings = parse_settings(config(handler="answer", time_limit_s=600, reward="verl", max_policy_lag=1))
    assert (settings.samples, settings.prompt_length, settings.response_length) == (4, 8, 6)
    assert settings.sampling.temperature == 0.7 and settings.logprobs_mode.value == "processed"
    assert settings.reward is RewardSource.VERL and settings.reward_spec() == {"source": "default"}
    assert (settings.time_limit_s, settings.max_policy_lag, settings.tokenizer) == (600.0, 1, "/models/tiny")
    for block, message in (
            ({"time_limit_s": -1}, r"hpc_rollout.time_limit_s must be a number in \[0.001"),
            ({"reward": "model"}, "use one of handler, verl, custom"),
            ({"reward": "custom"}, "reward.custom_reward_function.path"),
            ({"spool_dir": "x"}, "unknown key.*hpc_rollout.spool_dir; valid: spool"),
            ({"poll_s": "fast"}, "poll_s must be a number"),
            ({"register_servers": "yes"}, "true or false")):
        with pytest.raises(VerlConfigError, match=message):
            parse_settings(config(**block))
    with pytest.raises(VerlConfigError, match=r"no `hpc_rollout` block: add at least `\+hpc_rollout.spool"):
        parse_settings({"actor_rollout_ref": {}})
    bad_mode = config()
    bad_mode["actor_rollout_ref"]["rollout"]["logprobs_mode"] = "raw_logits"
    with pytest.raises(VerlConfigError, match="not logprobs"):
        parse_settings(bad_mode)


def row(status: str, prompt: list[int], response: list[int], mask: list[int], reward: float | None,
        **extra: Any) -> dict[str, Any]:
    return {"job_id": f"j{len(prompt)}{len(response)}", "status": status, "reward": reward,
            "prompt_ids": np.array(prompt), "response_ids": np.array(response), "response_mask": np.array(mask),
            "logprobs": np.array([-0.5] * len(response), dtype=np.float32), "policy_version_min": 3, **extra}


def test_the_layout_by_hand_masked_samples_truncation_and_reward_extras() -> None:
    slots = [
        row("ok", [5, 6], [7, 8, 9, 10], [1, 0, 0, 1], 1.0, result='{"reward_extra_info": {"acc": true}}'),
        row("cancelled", [], [], [], None),
        None,                                                   # no row by the time limit
        row("ok", [4], [1, 2, 3, 4, 5, 6, 7, 8], [1] * 8, 0.5),  # longer than response_length 6
    ]
    out = assemble(slots, ["u1", "u1", "u2", "u2"], [[5, 6], [5, 6], [9], [4]], prompt_length=3, response_length=6)
    t = out.tensors
    assert t[keys.PROMPTS].tolist() == [[0, 5, 6], [0, 5, 6], [0, 0, 9], [0, 0, 4]]          # left-padded
    assert t[keys.RESPONSES].tolist() == [[7, 8, 9, 10, 0, 0], [0] * 6, [0] * 6, [1, 2, 3, 4, 5, 6]]
    assert t[keys.RESPONSE_MASK].tolist() == [[1, 0, 0, 1, 0, 0], [0] * 6, [0] * 6, [1] * 6]
    assert t[keys.ATTENTION_MASK].tolist() == [[0, 1, 1, 1, 1, 1, 1, 0, 0], [0, 1, 1] + [0] * 6,
                                               [0, 0, 1] + [0] * 6, [0, 0, 1] + [1] * 6]
    assert t[keys.POSITION_IDS][0].tolist() == [0, 0, 1, 2, 3, 4, 5, 5, 5]                 # verl's cumsum rule
    assert t[keys.RM_SCORES].tolist() == [[0, 0, 0, 1.0, 0, 0], [0] * 6, [0] * 6, [0, 0, 0, 0, 0, 0.5]]
    assert t[keys.ROLLOUT_LOG_PROBS][0].tolist() == [-0.5, 0, 0, -0.5, 0, 0]                 # 0 where the mask is 0
    assert np.array_equal(t[keys.INPUT_IDS], np.concatenate([t[keys.PROMPTS], t[keys.RESPONSES]], axis=1))
    counts = out.counts
    assert (counts.ok, counts.masked, counts.cancelled, counts.missing, counts.truncated_responses) == (2, 2, 1, 1, 1)
    assert out.non_tensors[keys.UID].tolist() == ["u1", "u1", "u2", "u2"]
    assert out.non_tensors[keys.NUM_TURNS].tolist() == [4, 1, 1, 2]     # prompt + [model, tool, model]
    assert out.non_tensors["hpc_rollout_status"].tolist() == ["ok", "cancelled", "missing", "ok"]
    assert out.reward_extra_keys == ["acc"] and out.non_tensors["acc"].tolist() == [True, None, None, None]
    tokenless = {"job_id": "s", "status": "ok", "reward": 1.0, "prompt_ids": None, "response_ids": None}
    sleep = assemble([tokenless], ["u"], [[3]], prompt_length=2, response_length=2)   # a handler without an LLM
    assert sleep.counts.ok == 1 and sleep.tensors[keys.ATTENTION_MASK].tolist() == [[0, 1, 0, 0]]
    too_long = assemble([row("ok", [1, 2, 3, 4], [5], [1], 1.0)], ["u"], [[]], prompt_length=3, response_length=2)
    assert too_long.counts.prompt_too_long == 1 and too_long.tensors[keys.RESPONSE_MASK].sum() == 0


def test_the_policy_version_a_batch_is_sampled_with() -> None:
    assert policy_version_of({"global_steps": 1}) == 0          # after update_weights(0), before step 1's update
    assert policy_version_of({"global_steps": 5}) == 4
    assert policy_version_of({"global_steps": 5, "validate": True}) == 5
    assert policy_version_of({}) is None and policy_version_of({"global_steps": "x"}) is None


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the custom function runs in a bubblewrap sandbox")
def test_a_custom_reward_function_is_called_the_way_verl_calls_it(tmp_path: Path) -> None:
    module = tmp_path / "my_reward.py"
    module.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n"
                      "    return scale * (solution_str.strip() == ground_truth) + extra_info['index']\n")
    instance = {"data_source": "x", "reward_model": {"ground_truth": "42"}, "extra_info": {"index": 2}}
    spec = {"source": "custom", "reward_kwargs": {"scale": 3.0}}
    operator = Rewards(verl_custom_path=str(module), verl_custom_name="compute_score")
    paths = make_run(tmp_path / "run")

    def score(spec: dict[str, Any], rewards: Rewards, reply: str = "42") -> dict[str, Any]:
        job = JobSpec(job_id="s-0000000-0000", group_id="s-0000000", instance_id="i", sample_index=0,
                      handler="answer", instance=instance)
        services = WorkerServices(paths=paths, worker_id="w", node=current_node(), runtime="bwrap", rewards=rewards)
        return asyncio.run(score_with_verl(spec, instance, reply, JobContext(job, Stage.EVAL, 1, services)))

    assert score(spec, operator, " 42 ") == {"reward": 5.0, "reward_extra_info": {"acc": 5.0}}
    with pytest.raises(ScorerSandboxError, match="no function 'missing'"):
        score(spec, Rewards(verl_custom_path=str(module), verl_custom_name="missing"))
    with pytest.raises(VerlRewardError, match="must be"):
        check_spec({"source": "elsewhere"})
    with pytest.raises(VerlRewardError, match="needs verl on the EVAL workers"):   # verl is not installed here
        score({"source": "default"}, Rewards())
