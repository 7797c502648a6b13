"""verl's reward functions, run at EVAL on our workers (a handler's eval calls `score_with_verl`).

Here, not in orchestrator/trainer/verl/, because handlers (below the trainer layer) call it.

A job asks for it with an instance key `verl_reward` (the loop manager adds it when the verl config
says `hpc_rollout.reward: verl | custom`; a hand-written task may carry it too):

    {"source": "default"}                                   verl.utils.reward_score.default_compute_score
    {"source": "custom", "path": "/x/my_reward.py", "name": "compute_score", "reward_kwargs": {...}}

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

from orchestrator.errors import HpcRolloutError

INSTANCE_KEY = "verl_reward"
SOURCES = ("default", "custom")


class VerlRewardError(HpcRolloutError, ValueError):
    """The job's `verl_reward` cannot be used as written; the message says how to fix it."""


def check_spec(spec: Any) -> None:
    """Refuse a malformed `verl_reward` at submit time, not at EVAL."""
    if not isinstance(spec, Mapping) or spec.get("source") not in SOURCES:
        raise VerlRewardError(f"{INSTANCE_KEY} must be {{'source': 'default'}} or {{'source': 'custom', "
                              f"'path': FILE.py, 'name': FUNCTION}}, got {spec!r}")
    if spec["source"] == "custom":
        path = spec.get("path")
        if not isinstance(path, str) or not path.endswith(".py"):
            raise VerlRewardError(f"{INSTANCE_KEY}.path must be a Python file, got {path!r}")
        if not isinstance(spec.get("name", "compute_score"), str):
            raise VerlRewardError(f"{INSTANCE_KEY}.name must name a function in {path}")
        if not isinstance(spec.get("reward_kwargs", {}), Mapping):
            raise VerlRewardError(f"{INSTANCE_KEY}.reward_kwargs must be a mapping")


def score_with_verl(spec: Mapping[str, Any], instance: Mapping[str, Any], solution_str: str) -> dict[str, Any]:
    """{"reward": float, "reward_extra_info": {...}} for one finished job."""
    check_spec(spec)
    function = _default_compute_score() if spec["source"] == "default" else _load_custom(
        str(spec["path"]), str(spec.get("name", "compute_score")))
    reward_model = instance.get("reward_model") if isinstance(instance.get("reward_model"), Mapping) else {}
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
        raise VerlRewardError(f"{INSTANCE_KEY}.path {path} does not exist on this worker ({sys.argv[0]})")
    spec = importlib.util.spec_from_file_location(f"hpc_rollout_verl_reward_{abs(hash(path))}", file)
    if spec is None or spec.loader is None:
        raise VerlRewardError(f"{INSTANCE_KEY}.path {path} cannot be imported")
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
