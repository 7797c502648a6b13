"""The `hpc_rollout` block of a verl config, and the verl rollout settings the manager follows.

    python -m verl.trainer.main_ppo ... \\
      actor_rollout_ref.rollout.agent.agent_loop_manager_class=orchestrator.trainer.verl.SpoolLoopManager \\
      +hpc_rollout.spool=/scratch/spool/run1 +hpc_rollout.handler=answer +hpc_rollout.time_limit_s=600

Keys of `hpc_rollout` (every one bounded; an unknown key is an error that lists the valid ones):
    spool            run directory (created when missing)                               required
    handler          handler for rows whose data_source names none                      None
    source_handlers  {data_source: handler}, over run.toml's [data_sources]             {}
    time_limit_s     generate_sequences returns at this limit with what finished; the  None (wait for all)
                     rest is cancelled and masked
    cancel_grace_s   after the limit, how long the cancelled jobs get to be gone (rows  30
                     in, claims released, requests aborted): orchestrator/trainer/time_limit.py
    warm_up_s        create() warms fresh workers with real rows for at most this long  120
                     before the first step (0: no warm-up): warm_up.py
    max_policy_lag   samples older than the current policy - lag are stale (-1: none)   run.toml's
    poll_s           how often the shards are polled                                    0.05
    reward           handler | verl (verl's default_compute_score) | custom            handler (custom when
                     (`reward.custom_reward_function` of verl's config: path, name,     verl's custom_reward_
                     reward_kwargs)                                                     function is set)
    register_servers register verl's own rollout servers in the spool's registry       true
    sampling         extra sampling parameters for every job (e.g. {"max_tokens": 256}) {}

From verl's config: rollout.n (samples per prompt), rollout.prompt_length / response_length (the
padding), rollout.temperature / top_p / top_k (and val_kwargs for validation), rollout.logprobs_mode
(the kind of logprobs the trainer expects), rollout.name (the protocol of its own servers),
actor_rollout_ref.model.path (their tokenizer). verl's reward and agent settings (reward managers,
reward models, the overlong penalty, tools, agent loops) are applied or refused by verl_config.py.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.errors import HpcRolloutError
from orchestrator.grading.verl_reward import VerlRewardError, check_reward_kwargs
from orchestrator.llm.errors import RegistryError
from orchestrator.llm.logprob_mode import LogprobMode, parse_logprob_mode
from orchestrator.settings_spec import Family, checked, declarations, setting
from orchestrator.trainer.verl.verl_config import (
    Overlong, adopts_custom_function, custom_reward_function, overlong_of, refusal,
)

log = logging.getLogger(__name__)
BLOCK = "hpc_rollout"
MAX_TIME_LIMIT_S = 7 * 24 * 3600.0
MAX_CANCEL_GRACE_S = 3600.0
MAX_LENGTH = 1 << 20
T = TypeVar("T")


class VerlConfigError(HpcRolloutError, ValueError):
    """The verl config cannot drive the spool as written; the message names the key and the fix."""


class LogprobModeMismatch(VerlConfigError):
    """The backends return another kind of logprobs than verl's rollout.logprobs_mode expects."""


class RewardSource(str, enum.Enum):
    HANDLER = "handler"   # the handler's own EVAL (the default)
    VERL = "verl"         # verl.utils.reward_score.default_compute_score, at EVAL on our workers
    CUSTOM = "custom"     # verl's custom_reward_function convention (path, name, reward_kwargs)


@dataclass(frozen=True)
class Sampling:
    temperature: float = setting(1.0, "sampling temperature", bounds=(0.0, 100.0))
    top_p: float = setting(1.0, "nucleus sampling's probability mass", bounds=(0.0, 1.0))
    top_k: int = setting(-1, "the most likely tokens sampled from (-1 or null: all)", bounds=(-1, 1 << 31))

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p}
        if self.top_k > 0:
            params["top_k"] = self.top_k
        return params


@dataclass(frozen=True)
class CustomReward:
    path: str
    name: str = "compute_score"
    reward_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def run_settings(self) -> dict[str, str]:
        """run.toml [rewards]: the operator's function, which rows can only select."""
        return {"rewards.verl_custom_path": self.path, "rewards.verl_custom_name": self.name}


@dataclass(frozen=True)
class ManagerSettings:
    spool: Path
    handler: str | None = None
    source_handlers: Mapping[str, str] = field(default_factory=dict)
    time_limit_s: float | None = None
    cancel_grace_s: float = 30.0
    warm_up_s: float = 120.0
    max_policy_lag: int | None = None
    poll_s: float = 0.05
    reward: RewardSource = RewardSource.HANDLER
    custom_reward: CustomReward | None = None
    overlong: Overlong | None = None       # verl's DAPO overlong penalty, applied at assembly
    register_servers: bool = True
    extra_sampling: Mapping[str, Any] = field(default_factory=dict)
    # from verl's rollout config
    samples: int = 1
    prompt_length: int = 512
    response_length: int = 512
    sampling: Sampling = field(default_factory=Sampling)
    validation_sampling: Sampling = field(default_factory=Sampling)
    logprobs_mode: LogprobMode = LogprobMode.PROCESSED
    server_protocol: str = "vllm"
    tokenizer: str | None = None

    def reward_spec(self) -> dict[str, Any] | None:
        """What a job's instance carries under `verl_reward` (None: the handler scores)."""
        if self.reward is RewardSource.VERL:
            return {"source": "default"}
        if self.reward is RewardSource.CUSTOM and self.custom_reward is not None:
            return {"source": "custom", "reward_kwargs": dict(self.custom_reward.reward_kwargs)}
        return None


@dataclass(frozen=True)
class Block:
    """The `hpc_rollout` block as written (the table above); `object` keys are read by parse_settings."""

    spool: Any = setting(None, "run directory (created when missing)", kind=object)
    handler: Any = setting(None, "handler for rows whose data_source names none", kind=object)
    source_handlers: Any = setting(None, "{data_source: handler}, over run.toml's [data_sources]", kind=object)
    time_limit_s: float | None = setting(
        None, "generate_sequences returns at this limit with what finished", bounds=(0.001, MAX_TIME_LIMIT_S), kind=float)
    cancel_grace_s: float = setting(
        30.0, "after the limit, how long the cancelled jobs get to be gone", bounds=(0.0, MAX_CANCEL_GRACE_S))
    warm_up_s: float = setting(
        120.0, "create() warms fresh workers for at most this long (0: no warm-up)", bounds=(0.0, MAX_CANCEL_GRACE_S))
    max_policy_lag: int | None = setting(
        None, "samples older than the current policy - lag are stale (-1: none)", bounds=(-1, 1_000_000), kind=int)
    poll_s: float = setting(0.05, "how often the shards are polled", bounds=(0.001, 60.0))
    reward: RewardSource = setting(RewardSource.HANDLER, "who scores a job")
    register_servers: bool = setting(True, "register verl's own rollout servers in the spool's registry")
    sampling: Any = setting(None, "extra sampling parameters for every job", kind=object)


@dataclass(frozen=True)
class RolloutShape:
    """What the manager reads of verl's actor_rollout_ref.rollout besides sampling (its other keys are verl's)."""

    n: int = setting(1, "samples per prompt", bounds=(1, 100_000))
    prompt_length: int = setting(512, "prompt tokens (the padding)", bounds=(1, MAX_LENGTH))
    response_length: int = setting(512, "response tokens (the padding)", bounds=(1, MAX_LENGTH))


# Numbers as verl's config writes them (never text, never a bool); errors name the key as a command line sets it.
VERL = Family("key", BLOCK + ".{key}", VerlConfigError,
              out_of_range="{name} must be {kind} in [{low}, {high}], got {value!r}",
              not_a_choice="{name} {value!r} is not valid; use one of {choices}")


def read_declared(cls: type[T], section: Mapping[str, Any], where: str) -> T:
    """`cls` from the keys of `section` it declares, each checked (a verl section's other keys are verl's)."""
    values = {key: section[key] for key in declarations(cls) if key in section}
    return cls(**checked(cls, values, replace(VERL, label=where + ".{key}")))


def to_plain(config: Any) -> Any:
    """A DictConfig (or anything mapping-like) as plain dicts and lists, interpolations resolved."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(config, (DictConfig, ListConfig)):
            return OmegaConf.to_container(config, resolve=True)
    except ImportError:   # no omegaconf: already plain
        pass
    return config


def parse_settings(config: Any) -> ManagerSettings:
    """ManagerSettings from the whole verl config (DictConfig or plain dict)."""
    plain = to_plain(config)
    if not isinstance(plain, Mapping):
        raise VerlConfigError(f"the verl config must be a mapping, got {type(plain).__name__}")
    block = plain.get(BLOCK)
    if not isinstance(block, Mapping):
        raise VerlConfigError(f"the verl config has no `{BLOCK}` block: add at least `+{BLOCK}.spool=RUN_DIR`")
    written = Block(**checked(Block, block, VERL))
    rollout = _mapping(_dig(plain, "actor_rollout_ref", "rollout"), "actor_rollout_ref.rollout")
    spool = block.get("spool")
    if not isinstance(spool, str) or not spool.strip():
        raise VerlConfigError(f"{BLOCK}.spool must be the run directory's path (e.g. /scratch/spool/run1)")
    reward = written.reward
    problem = refusal(plain, block.get("reward"))   # verl settings this manager would otherwise ignore
    if problem:
        raise VerlConfigError(problem)
    if adopts_custom_function(plain, block.get("reward")):
        reward = RewardSource.CUSTOM
        log.info("hpc-rollout: reward.custom_reward_function is set: jobs are scored with it at EVAL "
                 "(as +hpc_rollout.reward=custom)")
    custom = _custom_reward(plain) if reward is RewardSource.CUSTOM else None
    try:
        mode = parse_logprob_mode(rollout.get("logprobs_mode") or "processed_logprobs",
                                  "actor_rollout_ref.rollout.logprobs_mode")
    except RegistryError as exc:
        raise VerlConfigError(str(exc)) from None
    handler = block.get("handler")
    if handler is not None and (not isinstance(handler, str) or not handler):
        raise VerlConfigError(f"{BLOCK}.handler must name a handler, e.g. answer")
    sources = block.get("source_handlers") or {}
    if not isinstance(sources, Mapping) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                   for k, v in sources.items()):
        raise VerlConfigError(f"{BLOCK}.source_handlers must map data_source names to handler names")
    extra = block.get("sampling") or {}
    if not isinstance(extra, Mapping):
        raise VerlConfigError(f"{BLOCK}.sampling must be a mapping of sampling parameters, e.g. {{max_tokens: 256}}")
    model_path = _dig(plain, "actor_rollout_ref", "model", "path")
    shape = read_declared(RolloutShape, rollout, "actor_rollout_ref.rollout")
    return ManagerSettings(
        spool=Path(spool).expanduser(),
        handler=handler,
        source_handlers=dict(sources),
        time_limit_s=written.time_limit_s,
        cancel_grace_s=written.cancel_grace_s,
        warm_up_s=written.warm_up_s,
        max_policy_lag=written.max_policy_lag,
        poll_s=written.poll_s,
        reward=reward,
        custom_reward=custom,
        register_servers=written.register_servers,
        extra_sampling=dict(extra),
        samples=shape.n,
        prompt_length=shape.prompt_length,
        response_length=shape.response_length,
        sampling=_sampling(rollout, "actor_rollout_ref.rollout"),
        validation_sampling=_sampling(_mapping(rollout.get("val_kwargs") or {}, "rollout.val_kwargs"),
                                      "actor_rollout_ref.rollout.val_kwargs"),
        logprobs_mode=mode,
        server_protocol="sglang" if str(rollout.get("name") or "vllm") == "sglang" else "vllm",
        tokenizer=model_path if isinstance(model_path, str) else None,
        overlong=overlong_of(plain),
    )


def _custom_reward(plain: Mapping[str, Any]) -> CustomReward:
    # verl 0.9 reads reward.custom_reward_function; its legacy top-level key counts when set, as
    # verl's migrate_legacy_reward_impl moves it there (verl_config.py).
    found = custom_reward_function(plain).value
    path = found.get("path") if isinstance(found, Mapping) else None
    if not isinstance(path, str) or not path:
        raise VerlConfigError(f"{BLOCK}.reward=custom needs reward.custom_reward_function.path=FILE.py "
                              "(and .name, default compute_score)")
    if not Path(path).expanduser().is_file():
        raise VerlConfigError(f"reward.custom_reward_function.path {path!r} is not a file the workers can read")
    kwargs = found.get("reward_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise VerlConfigError("reward.custom_reward_function.reward_kwargs must be a mapping")
    try:   # refused here, before a step's jobs run, not at their EVAL
        check_reward_kwargs(kwargs, "custom", "reward.custom_reward_function.reward_kwargs")
    except VerlRewardError as exc:
        raise VerlConfigError(str(exc)) from None
    return CustomReward(str(Path(path).expanduser().resolve()), str(found.get("name") or "compute_score"), dict(kwargs))


def _sampling(section: Mapping[str, Any], where: str) -> Sampling:
    if "top_k" in section and section["top_k"] is None:   # verl's null: no top-k
        section = {key: value for key, value in section.items() if key != "top_k"}
    return read_declared(Sampling, section, where)


def _dig(data: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)  # type: ignore[assignment]
    return data


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise VerlConfigError(f"{where} must be a mapping")
    return value
