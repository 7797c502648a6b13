"""verl's own settings that change what a rollout is: each honoured here, or refused in one line.

SpoolLoopManager replaces verl's agent loops and scores at EVAL on the spool's workers, so the
verl settings that configure those (reward managers, reward models, tools, agent loops) would be
ignored without a word. Read for verl 0.9.1 (trainer/config/_generated_ppo_trainer.yaml, reward
managers in experimental/reward_loop/reward_manager/); only a value changed from verl's default
counts, so the default config is never refused. The table is docs/trainer.md "verl settings and
what they do here".

Legacy top-level keys (`custom_reward_function`, `reward_model.*`, `sandbox_fusion`) are read as
their `reward.*` counterparts, as verl's own `migrate_legacy_reward_impl` maps them; a refusal
names the key the user set. No verl import: plain mappings in, plain values out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_AGENT_LOOP = "single_turn_agent"
# Reward managers whose scoring is the scorer's result as it is (naive), or that plus the overlong
# penalty applied at assembly (dapo): the same numbers as verl's managers produce.
HONOURED_MANAGERS = ("naive", "dapo")
AGENT_REPLACEMENT = ("hpc-rollout runs a handler per row instead of verl's agent loops: choose it with "
                     "+hpc_rollout.source_handlers={DATA_SOURCE: HANDLER} or +hpc_rollout.handler=HANDLER "
                     "(handlers bring their own tools, e.g. math's python tool in a sandbox)")
SCORER_REPLACEMENT = ("scoring runs at EVAL on the spool's workers: use +hpc_rollout.reward=custom with "
                      "reward.custom_reward_function.path=FILE.py (a function that may call your model's server)")


@dataclass(frozen=True)
class Overlong:
    """DAPO's overlong penalty (verl's DAPORewardManager): reward += min(-(L - (max_resp_len - len)) /
    len * penalty_factor, 0), L = the response's attended tokens."""

    max_response_length: int     # reward.reward_kwargs.max_resp_len
    buffer: int                  # overlong_buffer_cfg.len
    penalty_factor: float
    log: bool                    # overlong_reward and overlong as reward extras

    def penalties(self, lengths: np.ndarray) -> np.ndarray:
        """float32, as verl's torch arithmetic on an int64 length gives it."""
        exceed = (lengths.astype(np.int64) - (self.max_response_length - self.buffer)).astype(np.float32)
        penalty = -exceed / np.float32(self.buffer) * np.float32(self.penalty_factor)
        return np.minimum(penalty, np.float32(0.0))


@dataclass(frozen=True)
class ConfigValue:
    name: str        # the key as the user wrote it (legacy or reward.*)
    value: Any


def reward_setting(config: Mapping[str, Any], path: str, legacy: str | None = None) -> ConfigValue:
    """`reward.<path>`, or its legacy key when that is set (verl's migration: the legacy value wins)."""
    if legacy is not None:
        old = dig(config, *legacy.split("."))
        if old is not None:
            return ConfigValue(legacy, old)
    return ConfigValue(f"reward.{path}", dig(config, "reward", *path.split(".")))


def custom_reward_function(config: Mapping[str, Any]) -> ConfigValue:
    """reward.custom_reward_function, or the legacy top-level one when any of its fields is set."""
    legacy = config.get("custom_reward_function")
    if isinstance(legacy, Mapping) and any(v is not None for v in legacy.values()):
        return ConfigValue("custom_reward_function", legacy)
    return ConfigValue("reward.custom_reward_function", dig(config, "reward", "custom_reward_function") or {})


def adopts_custom_function(config: Mapping[str, Any], reward: Any) -> bool:
    """True when verl's custom_reward_function is set and hpc_rollout.reward was left unset: score with it."""
    return reward is None and bool(_path(custom_reward_function(config).value))


def refusal(config: Mapping[str, Any], reward: Any) -> str | None:
    """The first verl setting of `config` this manager cannot honour, as one line naming the replacement."""
    for check in (_custom_function_refusal, _reward_model_refusal, _manager_refusal, _overlong_refusal,
                  _sandbox_fusion_refusal, _agent_refusal):
        problem = check(config, reward)
        if problem:
            return problem
    return None


def overlong_of(config: Mapping[str, Any]) -> Overlong | None:
    """The overlong penalty when verl would apply it (dapo manager, buffer enabled); call after `refusal`."""
    manager = reward_setting(config, "reward_manager.name", "reward_model.reward_manager").value
    cfg = dig(_reward_kwargs(config).value, "overlong_buffer_cfg")
    if manager != "dapo" or not isinstance(cfg, Mapping) or not cfg.get("enable"):
        return None
    return Overlong(max_response_length=int(dig(_reward_kwargs(config).value, "max_resp_len")),
                    buffer=int(cfg["len"]), penalty_factor=float(cfg["penalty_factor"]), log=bool(cfg.get("log")))


def rows_refusal(agent_names: Any) -> str | None:
    """Rows of verl's batch that name an agent loop (the dataset's `agent_name` column) other than the single turn."""
    if agent_names is None:
        return None
    others = sorted({str(name) for name in agent_names if name is not None and str(name) != DEFAULT_AGENT_LOOP})
    if not others:
        return None
    return f"rows name agent_name {', '.join(repr(o) for o in others)} (verl's agent loops): {AGENT_REPLACEMENT}"


# -- the checks, one per family of settings -------------------------------------------------------
def _custom_function_refusal(config: Mapping[str, Any], reward: Any) -> str | None:
    found = custom_reward_function(config)
    path = _path(found.value)
    if not path or reward in (None, "custom"):
        return None
    return (f"{found.name}.path={path} is set but hpc_rollout.reward={reward}: verl would score with that function; "
            f"set +hpc_rollout.reward=custom to use it, or unset {found.name}.path")


def _reward_model_refusal(config: Mapping[str, Any], reward: Any) -> str | None:
    enabled = reward_setting(config, "reward_model.enable", "reward_model.enable")
    if not enabled.value:
        return None
    return (f"{enabled.name}={enabled.value}: verl's reward model is never called by SpoolLoopManager; "
            f"{SCORER_REPLACEMENT}, and unset {enabled.name}")


def _manager_refusal(config: Mapping[str, Any], reward: Any) -> str | None:
    source = reward_setting(config, "reward_manager.source", "reward_model.reward_loop_source")
    if source.value not in (None, "register"):
        return (f"{source.name}={source.value}: a reward manager class of your own is not run by SpoolLoopManager; "
                f"{SCORER_REPLACEMENT}")
    name = reward_setting(config, "reward_manager.name", "reward_model.reward_manager")
    if name.value in (None, *HONOURED_MANAGERS):
        return None
    return (f"{name.name}={name.value}: verl's {name.value} reward manager is not applied by SpoolLoopManager "
            f"(naive and dapo are); {SCORER_REPLACEMENT}")


def _reward_kwargs(config: Mapping[str, Any]) -> ConfigValue:
    return reward_setting(config, "reward_kwargs", "reward_model.reward_kwargs")


def _overlong_refusal(config: Mapping[str, Any], reward: Any) -> str | None:
    kwargs = _reward_kwargs(config)
    cfg = dig(kwargs.value, "overlong_buffer_cfg")
    if not isinstance(cfg, Mapping) or not cfg.get("enable"):
        return None
    where = f"{kwargs.name}.overlong_buffer_cfg"
    manager = reward_setting(config, "reward_manager.name", "reward_model.reward_manager")
    if manager.value != "dapo":
        return (f"{where}.enable={cfg.get('enable')}: the overlong penalty is part of verl's dapo reward manager "
                f"only; set {manager.name}=dapo to apply it (at assembly, verl's formula), or disable the buffer")
    # verl's DAPORewardManager asserts these; refused here before any job runs
    length, factor, limit = cfg.get("len"), cfg.get("penalty_factor"), dig(kwargs.value, "max_resp_len")
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        return f"{where}.len must be a positive integer, got {length!r} (or disable the buffer)"
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not np.isfinite(factor):
        return f"{where}.penalty_factor must be a number, got {factor!r}"
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < length:
        return (f"{kwargs.name}.max_resp_len must be an integer >= {where}.len ({length}), got {limit!r} "
                "(verl's DAPO recipe sets it to data.max_response_length)")
    return None


def _sandbox_fusion_refusal(config: Mapping[str, Any], reward: Any) -> str | None:
    url = reward_setting(config, "sandbox_fusion.url", "sandbox_fusion.url")
    if not url.value:
        return None
    return (f"{url.name}={url.value}: code replies are not posted to a Sandbox Fusion server here; with "
            "+hpc_rollout.reward=verl verl's code scorers run in a scorer sandbox of the worker's runtime "
            "(or map code datasets to the `code` handler with +hpc_rollout.source_handlers): unset it")


def _agent_refusal(config: Mapping[str, Any], reward: Any) -> str | None:
    rollout = dig(config, "actor_rollout_ref", "rollout")
    where = "actor_rollout_ref.rollout"
    loop = dig(rollout, "agent", "default_agent_loop")
    if loop not in (None, DEFAULT_AGENT_LOOP):
        return f"{where}.agent.default_agent_loop={loop}: {AGENT_REPLACEMENT}"
    for key in ("agent.agent_loop_config_path", "multi_turn.tool_config_path", "multi_turn.function_tool_path",
                # not in verl 0.9.1's yaml (it has no interactions), set by configs written for older verl
                "multi_turn.interaction_config_path"):
        value = dig(rollout, *key.split("."))
        if value:
            return f"{where}.{key}={value}: {AGENT_REPLACEMENT}"
    return None


def _path(function: Any) -> str | None:
    path = function.get("path") if isinstance(function, Mapping) else None
    return path if isinstance(path, str) and path else None


def dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data
