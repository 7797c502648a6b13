"""verl's reward functions, run at EVAL on our workers (a handler's eval calls `score_with_verl`).

Here, not in orchestrator/trainer/verl/, because handlers (below the trainer layer) call it.

A job asks for it with an instance key `verl_reward` (the loop manager adds it when the verl config
says `hpc_rollout.reward: verl | custom`; a hand-written task may carry it too):

    {"source": "default"}                          verl.utils.reward_score.default_compute_score
    {"source": "custom", "reward_kwargs": {...}}   the operator's function: run.toml [rewards]
                                                   verl_custom_path / verl_custom_name

The custom function's file is the operator's choice, never a row's: it runs on the worker, outside
every sandbox, so a row that names a file (`path`, `name`) is refused at submit, and a job that
carries one anyway (a ticket planted without submit) fails at EVAL without the file being read.

Called the way verl's naive reward manager calls it: compute_score(data_source=, solution_str=,
ground_truth=, extra_info=, **reward_kwargs), solution_str being the decoded response (sampled
and observation tokens, special tokens skipped). A float is the reward (extra info {"acc": it}, as
verl records it); a dict gives `score` as the reward and every key as extra info. `default` needs
verl on the worker (imported here, only then); `custom` loads the file with importlib, no verl needed.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from orchestrator.config import Rewards
from orchestrator.errors import HpcRolloutError

INSTANCE_KEY = "verl_reward"
SOURCES = ("default", "custom")


class VerlRewardError(HpcRolloutError, ValueError):
    """The job's `verl_reward` cannot be used as written; the message says how to fix it."""


ROW_KEYS = ("source", "reward_kwargs")
OPERATOR_KEYS = ("path", "name")   # the function itself: run.toml [rewards], never the row


def check_spec(spec: Any) -> None:
    """Refuse a malformed `verl_reward`, or one that names code to run, at submit time (and again at EVAL)."""
    if not isinstance(spec, Mapping) or spec.get("source") not in SOURCES:
        raise VerlRewardError(f"{INSTANCE_KEY} must be {{'source': 'default'}} or {{'source': 'custom'}} "
                              f"(with optional 'reward_kwargs'), got {spec!r}")
    named = [key for key in OPERATOR_KEYS if key in spec]
    if named:
        raise VerlRewardError(
            f"{INSTANCE_KEY} names {' and '.join(named)}: the reward function is the operator's choice, not a "
            f"row's (it runs on the worker, outside the sandbox): set run.toml [rewards] verl_custom_path "
            f"(and verl_custom_name) and give the row {{'source': 'custom'}}")
    unknown = sorted(set(spec) - set(ROW_KEYS))
    if unknown:
        raise VerlRewardError(f"{INSTANCE_KEY} takes only {', '.join(ROW_KEYS)}; unknown: {', '.join(unknown)}")
    if not isinstance(spec.get("reward_kwargs", {}), Mapping):
        raise VerlRewardError(f"{INSTANCE_KEY}.reward_kwargs must be a mapping")


def score_with_verl(spec: Mapping[str, Any], instance: Mapping[str, Any], solution_str: str,
                    rewards: Rewards) -> dict[str, Any]:
    """{"reward": float, "reward_extra_info": {...}} for one finished job; `rewards`: run.toml [rewards]."""
    check_spec(spec)
    if spec["source"] == "default":
        function = _default_compute_score()
    elif rewards.verl_custom_path:
        function = _load_custom(rewards.verl_custom_path, rewards.verl_custom_name)
    else:
        raise VerlRewardError(f"{INSTANCE_KEY} asks for the custom reward function, and the run names none: "
                              f"set run.toml [rewards] verl_custom_path (hpc-rollout init RUN_DIR --set "
                              f"rewards.verl_custom_path=FILE.py) before the workers start")
    reward_model = given if isinstance(given := instance.get("reward_model"), Mapping) else {}
    extra_info = dict(instance.get("extra_info") or {}) if isinstance(instance.get("extra_info"), Mapping) else {}
    result = function(data_source=instance.get("data_source"), solution_str=solution_str,
                      ground_truth=reward_model.get("ground_truth"), extra_info=extra_info,
                      **dict(spec.get("reward_kwargs") or {}))
    if inspect.isawaitable(result):
        raise VerlRewardError(f"{spec.get('name')} is a coroutine function: give a plain function for EVAL")
    if isinstance(result, Mapping):
        if "score" not in result:
            raise VerlRewardError(f"the reward function returned a dict without 'score': {sorted(result)}")
        score, extra = result["score"], {str(k): _plain(v) for k, v in result.items()}
    else:
        score, extra = result, {"acc": _plain(result)}
    reward = float(score)
    if not math.isfinite(reward):
        raise VerlRewardError(f"the reward function returned {score!r}, not a finite number")
    return {"reward": reward, "reward_extra_info": extra}


def _default_compute_score() -> Callable[..., Any]:
    try:
        from verl.utils.reward_score import default_compute_score
    except ImportError as exc:
        raise VerlRewardError(f"{INSTANCE_KEY} source 'default' needs verl on the EVAL workers "
                              f"(pip install 'hpc-rollout[verl]'): {exc}") from None
    return default_compute_score


@lru_cache(maxsize=16)
def _load_custom(path: str, name: str) -> Callable[..., Any]:
    file = Path(path)
    if not file.is_file():
        raise VerlRewardError(f"run.toml [rewards] verl_custom_path {path} does not exist on this worker ({sys.argv[0]})")
    spec = importlib.util.spec_from_file_location(f"hpc_rollout_verl_reward_{abs(hash(path))}", file)
    if spec is None or spec.loader is None:
        raise VerlRewardError(f"run.toml [rewards] verl_custom_path {path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function = getattr(module, name, None)
    if not callable(function):
        raise VerlRewardError(f"{path} has no function {name!r}")
    return function


def _plain(value: Any) -> Any:
    """JSON-friendly: numpy scalars and bools as Python numbers."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


async def decoded_response(paths: Any, result: Mapping[str, Any]) -> str:
    """The response as verl's reward managers see it: its ids decoded, special tokens skipped.

    For handlers that keep no text of the whole response (the agent families): the tokenizer is
    the one of the backend that sampled the last turn (its registry entry, else the model id
    the turn recorded, when that is a local directory), as RUN used it.
    """
    import asyncio

    from orchestrator.llm.registry import BackendRegistry
    from orchestrator.llm.session import cached_tokenizer

    turns = result.get("turns") or []
    last = turns[-1] if turns and isinstance(turns[-1], Mapping) else {}
    entry = BackendRegistry.of(paths).read().find(str(last.get("backend"))) if last.get("backend") else None
    candidates = [p for p in ((entry.tokenizer or entry.model) if entry else None, last.get("model")) if p]
    directory = next((str(Path(p).resolve()) for p in candidates if Path(str(p)).is_dir()), None)
    if directory is None:
        raise VerlRewardError("cannot decode the response for verl's reward: no local tokenizer for the backend "
                              f"{last.get('backend')!r}; register it with `hpc-rollout backend add ... --tokenizer DIR`")
    tokenizer = await asyncio.to_thread(cached_tokenizer, directory)
    return str(tokenizer.decode([int(i) for i in result.get("response_ids") or []], skip_special_tokens=True))
