"""Every verl setting that changes a rollout is honoured or refused in one line naming what replaces it.

Pure parts (no verl): parse_settings on plain configs with the sections of verl 0.9.1's
ppo_trainer.yaml that matter here, at their defaults (none refused), then each setting changed
from its default. tests/verl/test_silent.py does the same on the config hydra composes from verl's
own yaml, and checks the overlong penalty against verl's DAPORewardManager.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.trainer import verl_keys as keys
from orchestrator.trainer.verl.assemble import assemble
from orchestrator.trainer.verl.settings import RewardSource, VerlConfigError, parse_settings
from orchestrator.trainer.verl.verl_config import Overlong, rows_refusal


def defaults(**block: Any) -> dict[str, Any]:
    """verl 0.9.1's defaults for the keys read here (trainer/config/_generated_ppo_trainer.yaml)."""
    return {
        "actor_rollout_ref": {"model": {"path": "/models/tiny"}, "rollout": {
            "n": 2, "prompt_length": 8, "response_length": 8, "logprobs_mode": "processed_logprobs",
            "multi_turn": {"enable": False, "max_assistant_turns": None, "tool_config_path": None,
                           "function_tool_path": None, "max_user_turns": None, "format": "hermes"},
            "agent": {"num_workers": 8, "default_agent_loop": "single_turn_agent", "agent_loop_config_path": None,
                      "custom_async_server": {"path": None, "name": None}}}},
        "custom_reward_function": {"path": None, "name": None},
        "reward_model": {"reward_manager": None, "enable": None, "model": {"path": None}},
        "sandbox_fusion": {"url": None, "max_concurrent": None, "memory_limit_mb": None},
        "reward": {"num_workers": 8, "custom_reward_function": {"path": None, "name": "compute_score"},
                   "reward_manager": {"source": "register", "name": "naive",
                                      "module": {"path": None, "name": "custom_reward_manager"}},
                   "reward_model": {"enable": False, "model_path": None},
                   "sandbox_fusion": {"url": None, "max_concurrent": 64, "memory_limit_mb": 1024}},
        "hpc_rollout": {"spool": "/scratch/run1", **block},
    }


def changed(path: str, value: Any, **block: Any) -> dict[str, Any]:
    config = copy.deepcopy(defaults(**block))
    *parents, last = path.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return config


def refusal(config: dict[str, Any]) -> str:
    with pytest.raises(VerlConfigError) as raised:
        parse_settings(config)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_verls_defaults_are_not_refused() -> None:
    settings = parse_settings(defaults())
    assert settings.reward is RewardSource.HANDLER and settings.overlong is None


@pytest.mark.parametrize("path, value, named", [
    ("reward.reward_model.enable", True, "+hpc_rollout.reward=custom"),
    ("reward_model.enable", True, "+hpc_rollout.reward=custom"),                        # verl's legacy key
    ("reward.reward_manager.name", "gdpo", "+hpc_rollout.reward=custom"),
    ("reward_model.reward_manager", "remote", "+hpc_rollout.reward=custom"),
    ("reward.reward_manager.source", "importlib", "+hpc_rollout.reward=custom"),
    ("reward.sandbox_fusion.url", "http://fusion:8080", "+hpc_rollout.reward=verl"),
    ("actor_rollout_ref.rollout.agent.default_agent_loop", "tool_agent", "+hpc_rollout.handler"),
    ("actor_rollout_ref.rollout.agent.agent_loop_config_path", "/cfg/loops.yaml", "+hpc_rollout.source_handlers"),
    ("actor_rollout_ref.rollout.multi_turn.tool_config_path", "/cfg/tools.yaml", "+hpc_rollout.source_handlers"),
    ("actor_rollout_ref.rollout.multi_turn.function_tool_path", "/cfg/tools.py", "+hpc_rollout.source_handlers"),
    ("actor_rollout_ref.rollout.multi_turn.interaction_config_path", "/cfg/i.yaml", "+hpc_rollout.source_handlers"),
])
def test_each_setting_that_cannot_be_honoured_is_refused_naming_its_replacement(path: str, value: Any,
                                                                                 named: str) -> None:
    message = refusal(changed(path, value))
    assert message.startswith(f"{path}={value}") and named in message


def test_a_custom_reward_function_is_used_unless_hpc_rollout_reward_says_otherwise(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    function = tmp_path / "score.py"
    function.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    with caplog.at_level(logging.INFO, logger="orchestrator.trainer.verl"):
        settings = parse_settings(changed("reward.custom_reward_function.path", str(function)))
    assert settings.reward is RewardSource.CUSTOM and settings.custom_reward is not None
    assert settings.custom_reward.path == str(function.resolve()) and settings.custom_reward.name == "compute_score"
    assert any("as +hpc_rollout.reward=custom" in r.getMessage() for r in caplog.records)
    legacy = changed("custom_reward_function", {"path": str(function), "name": "compute_score"})   # verl's old key
    assert parse_settings(legacy).reward is RewardSource.CUSTOM
    for explicit in ("handler", "verl"):
        message = refusal(changed("reward.custom_reward_function.path", str(function), reward=explicit))
        assert message.startswith(f"reward.custom_reward_function.path={function} is set but hpc_rollout.reward="
                                  f"{explicit}") and "+hpc_rollout.reward=custom" in message


def overlong_config(**cfg: Any) -> dict[str, Any]:
    config = changed("reward.reward_manager.name", "dapo")
    config["reward"]["reward_kwargs"] = {"max_resp_len": 8, "overlong_buffer_cfg": {
        "enable": True, "len": 4, "penalty_factor": 1.0, "log": True, **cfg}}
    return config


def test_dapos_overlong_penalty_is_read_checked_and_refused_without_dapo() -> None:
    assert parse_settings(overlong_config()).overlong == Overlong(max_response_length=8, buffer=4,
                                                                  penalty_factor=1.0, log=True)
    assert parse_settings(changed("reward.reward_manager.name", "dapo")).overlong is None   # DAPO = naive + penalty
    legacy = changed("reward_model.reward_manager", "dapo")
    legacy["reward_model"]["reward_kwargs"] = overlong_config()["reward"]["reward_kwargs"]
    assert parse_settings(legacy).overlong is not None                                     # verl's old keys
    assert "max_resp_len" in refusal(overlong_config(len=16))                 # verl asserts max_resp_len >= len
    assert "overlong_buffer_cfg.len" in refusal(overlong_config(len=0))
    naive = overlong_config()
    naive["reward"]["reward_manager"]["name"] = "naive"
    message = refusal(naive)
    assert message.startswith("reward.reward_kwargs.overlong_buffer_cfg.enable=True") and "dapo" in message


def test_the_overlong_penalty_by_hand_in_the_assembled_batch() -> None:
    """verl's DAPO: reward += min(-(L - (max_resp_len - len)) / len * penalty_factor, 0), L = the response's
    attended tokens (sampled and observation)."""
    def ok(n: int, reward: float) -> dict[str, Any]:
        return {"job_id": f"j{n}", "status": "ok", "reward": reward, "prompt_ids": np.array([1]),
                "response_ids": np.arange(n) + 10, "response_mask": np.ones(n, dtype=np.int64)}
    slots = [ok(3, 1.0), ok(5, 1.0), ok(7, 0.0), ok(8, 1.0), {"job_id": "f", "status": "failed", "reward": None}]
    overlong = Overlong(max_response_length=8, buffer=4, penalty_factor=2.0, log=True)
    out = assemble(slots, ["u"] * 5, [[1]] * 5, prompt_length=2, response_length=8, overlong=overlong)
    # expected length 8 - 4 = 4: 3 -> 0, 5 -> -0.5, 7 -> -1.5, 8 -> -2.0; the failed sample stays masked at 0
    assert out.tensors[keys.RM_SCORES].sum(axis=1).tolist() == [1.0, 0.5, -1.5, -1.0, 0.0]
    assert out.non_tensors["overlong_reward"].tolist() == [0.0, -0.5, -1.5, -2.0, None]
    assert out.non_tensors["overlong"].tolist() == [False, True, True, True, None]
    assert {"overlong", "overlong_reward"} <= set(out.reward_extra_keys)


def test_rows_naming_a_verl_agent_loop_are_refused() -> None:
    assert rows_refusal(None) is None
    assert rows_refusal(np.array(["single_turn_agent"] * 3, dtype=object)) is None       # verl's default loop
    message = rows_refusal(np.array(["single_turn_agent", "tool_agent", "tool_agent"], dtype=object))
    assert message is not None and message.startswith("rows name agent_name 'tool_agent' (verl's agent loops): ")
    assert "+hpc_rollout.source_handlers" in message and "\n" not in message
