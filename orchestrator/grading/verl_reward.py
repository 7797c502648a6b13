"""verl's reward functions, run at EVAL on our workers (a handler's eval calls `score_with_verl`).

Here, not in orchestrator/trainer/verl/, because handlers (below the trainer layer) call it.

A job asks for it with an instance key `verl_reward` (the loop manager adds it when the verl config
says `hpc_rollout.reward: verl | custom`; a hand-written task may carry it too):

    {"source": "default"}                          verl.utils.reward_score.default_compute_score
    {"source": "custom", "reward_kwargs": {...}}   the operator's function: run.toml [rewards]
                                                   verl_custom_path / verl_custom_name

No scorer runs the model's output on the worker. verl's default_compute_score runs in the worker's
process only for the data sources whose scorers just compare strings (STRING_SCORED_SOURCES, read
and attacked for verl 0.9.1: gsm8k, math_reward, math_dapo, search_r1's exact match); every other
source, and every other verl version, runs it in a scorer sandbox of its own (scorer_sandbox.py):
prime_code executes the reply as a program (codecontests, apps, codeforces, taco) and prime_math
hands it to eval() (numina_*). The operator's custom function always runs there. With the `local`
runtime (no sandbox) these are refused: at submit when run.toml says `local` (`refuse_unsandboxed`),
and at EVAL.

A row chooses no code: the custom function's file is run.toml's (a row that names a file, `path` or
`name`, is refused at submit, and a planted one fails at EVAL without the file being read);
`reward_kwargs` may not name the scorer's own arguments, nor, for `default`, the remote code runner
verl would post the reply to (sandbox_fusion_url: the operator's choice, not a row's).

Called the way verl's naive reward manager calls it: compute_score(data_source=, solution_str=,
ground_truth=, extra_info=, **reward_kwargs), solution_str being the decoded response (sampled
and observation tokens, special tokens skipped). A float is the reward (extra info {"acc": it}, as
verl records it); a dict gives `score` as the reward and every key as extra info. `default` needs
verl on the worker (its Python is what the scorer sandbox runs); `custom` needs no verl.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import HpcRolloutError
from orchestrator.grading.scorer_sandbox import ScorerCall, refuse_local, run_sandboxed

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext

log = logging.getLogger(__name__)

INSTANCE_KEY = "verl_reward"
SOURCES = ("default", "custom")
# What the scorer is always called with: reward_kwargs naming one of them would fail at EVAL.
SCORER_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")
# default_compute_score's own settings: a remote runner the reply is posted to (the operator's choice).
REMOTE_RUNNER_ARGUMENTS = ("sandbox_fusion_url", "concurrent_semaphore", "memory_limit_mb")

# verl 0.9.1's default_compute_score sends these data sources to scorers that only match and
# normalise strings (regular expressions; no eval, no sympy): safe to run in the worker. Read for
# that version only: with another, every source goes to the scorer sandbox.
STRING_SCORED_VERL_VERSIONS = ("0.9.1",)
STRING_SCORED_SOURCES = frozenset({
    "openai/gsm8k",                                                                    # gsm8k
    "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",  # math_reward
    "math_dapo", "math", "math_dapo_reasoning",                                        # math_dapo
    "searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",         # search_r1_like_qa_em
    "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle",
})
STRING_SCORED_PREFIXES = ("aime",)                                                     # math_dapo
DEFAULT_MODULE, DEFAULT_FUNCTION = "verl.utils.reward_score", "default_compute_score"


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
            f"row's: set run.toml [rewards] verl_custom_path (and verl_custom_name) and give the row "
            f"{{'source': 'custom'}}")
    unknown = sorted(set(spec) - set(ROW_KEYS))
    if unknown:
        raise VerlRewardError(f"{INSTANCE_KEY} takes only {', '.join(ROW_KEYS)}; unknown: {', '.join(unknown)}")
    kwargs = spec.get("reward_kwargs", {})
    if not isinstance(kwargs, Mapping):
        raise VerlRewardError(f"{INSTANCE_KEY}.reward_kwargs must be a mapping")
    check_reward_kwargs(kwargs, spec["source"], f"{INSTANCE_KEY}.reward_kwargs")


def check_reward_kwargs(kwargs: Mapping[str, Any], source: str, where: str) -> None:
    """Refuse keyword arguments the call cannot take (also for the verl config's own, trainer/verl/settings.py)."""
    clashing = sorted(set(kwargs) & set(SCORER_ARGUMENTS))
    if clashing:
        raise VerlRewardError(
            f"{where} {', '.join(clashing)} clash with the arguments the scorer is always called with "
            f"({', '.join(SCORER_ARGUMENTS)}): the call would fail at EVAL, after the job ran; rename them "
            f"(in the reward function and here) or drop them")
    remote = sorted(set(kwargs) & set(REMOTE_RUNNER_ARGUMENTS)) if source == "default" else []
    if remote:
        raise VerlRewardError(
            f"{where} {', '.join(remote)}: verl's default_compute_score would post the reply to that code runner; "
            f"a row does not choose where code runs: code sources are scored in the job's own scorer sandbox")


def may_run_code(spec: Mapping[str, Any], data_source: Any) -> bool:
    """Whether this scorer may run the model's output, by its data source as verl 0.9.1 routes it."""
    if spec.get("source") != "default":
        return True   # the operator's function: anything
    source = str(data_source)
    return not (source in STRING_SCORED_SOURCES or source.startswith(STRING_SCORED_PREFIXES))


def needs_sandbox(spec: Mapping[str, Any], data_source: Any) -> bool:
    """Whether this call runs in a scorer sandbox: it may run code, or the installed verl is not the one checked."""
    return may_run_code(spec, data_source) or _verl_version() not in STRING_SCORED_VERL_VERSIONS


def refuse_unsandboxed(instance: Mapping[str, Any], runtime: str) -> None:
    """At submit: VerlRewardError when the row's scorer may run the model's output and `runtime`
    (run.toml [sandbox] runtime) has no sandbox. A row without `verl_reward` passes. (The workers'
    verl version is not known here: EVAL refuses again, also for a verl whose scorers were not checked.)"""
    spec = instance.get(INSTANCE_KEY)
    if isinstance(spec, Mapping) and may_run_code(spec, instance.get("data_source")):
        try:
            refuse_local(runtime, _describe(spec, instance.get("data_source")))
        except ValueError as exc:
            raise VerlRewardError(str(exc)) from None


async def score_with_verl(spec: Mapping[str, Any], instance: Mapping[str, Any], solution_str: str,
                          ctx: "JobContext") -> dict[str, Any]:
    """{"reward": float, "reward_extra_info": {...}} for one finished job, scored at its EVAL."""
    check_spec(spec)
    rewards = ctx.services.rewards
    if spec["source"] == "custom" and not rewards.verl_custom_path:
        raise VerlRewardError(f"{INSTANCE_KEY} asks for the custom reward function, and the run names none: "
                              f"set run.toml [rewards] verl_custom_path (hpc-rollout init RUN_DIR --set "
                              f"rewards.verl_custom_path=FILE.py) before the workers start")
    reward_model = given if isinstance(given := instance.get("reward_model"), Mapping) else {}
    extra_info = dict(instance.get("extra_info") or {}) if isinstance(instance.get("extra_info"), Mapping) else {}
    kwargs = {"data_source": instance.get("data_source"), "solution_str": solution_str,
              "ground_truth": reward_model.get("ground_truth"), "extra_info": extra_info,
              **dict(spec.get("reward_kwargs") or {})}
    data_source = instance.get("data_source")
    if may_run_code(spec, data_source):   # refused by its name first: nothing is imported for it
        refuse_local(ctx.services.runtime, _describe(spec, data_source))
    if spec["source"] == "default":
        _verl_installed()
    if not needs_sandbox(spec, data_source):   # off the event loop: the first call imports verl (seconds)
        return _reward_of(await asyncio.to_thread(lambda: _default_compute_score()(**kwargs)))
    refuse_local(ctx.services.runtime, _describe(spec, data_source))   # a verl whose string scorers were not checked
    if spec["source"] == "default":
        call = ScorerCall(DEFAULT_FUNCTION, kwargs, module=DEFAULT_MODULE, light_parents=("verl", "verl.utils"),
                          packages=("verl",))
    else:
        call = ScorerCall(rewards.verl_custom_name, kwargs, file_text=_custom_source(rewards.verl_custom_path))
    return _reward_of(await run_sandboxed(ctx, call))


def _describe(spec: Mapping[str, Any], data_source: Any) -> str:
    if spec.get("source") == "custom":
        return f"{INSTANCE_KEY} 'custom' (the operator's reward function, run.toml [rewards] verl_custom_path)"
    if not may_run_code(spec, data_source):
        return (f"{INSTANCE_KEY} 'default' for data_source {data_source!r} with verl {_verl_version() or '(none)'} "
                f"(only verl {', '.join(STRING_SCORED_VERL_VERSIONS)}'s string scorers were checked)")
    return f"{INSTANCE_KEY} 'default' for data_source {data_source!r} (verl's scorer for it)"


def _reward_of(result: Any) -> dict[str, Any]:
    if isinstance(result, Mapping):
        if "score" not in result:
            raise VerlRewardError(f"the reward function returned a dict without 'score': {sorted(result)}")
        score, extra = result["score"], {str(k): _plain(v) for k, v in result.items()}
    else:
        score, extra = result, {"acc": _plain(result)}
    try:
        reward = float(score)
    except (TypeError, ValueError):
        raise VerlRewardError(f"the reward function returned {score!r}, not a number") from None
    if not math.isfinite(reward):
        raise VerlRewardError(f"the reward function returned {score!r}, not a finite number")
    return {"reward": reward, "reward_extra_info": extra}


@lru_cache(maxsize=1)
def _verl_version() -> str:
    """The installed verl's version, read from its metadata (verl itself is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("verl")
    except PackageNotFoundError:
        return ""
    if found not in STRING_SCORED_VERL_VERSIONS:
        log.warning("verl %s is not the version whose string scorers were checked (%s): every data source is "
                    "scored in a scorer sandbox", found, ", ".join(STRING_SCORED_VERL_VERSIONS))
    return found


def _default_compute_score() -> Callable[..., Any]:
    try:
        from verl.utils.reward_score import default_compute_score
    except ImportError as exc:
        raise VerlRewardError(f"{INSTANCE_KEY} source 'default' needs verl on the EVAL workers "
                              f"(pip install 'hpc-rollout[verl]'): {exc}") from None
    return default_compute_score


def _verl_installed() -> None:
    """verl is found without being imported (a sandbox may import it): a missing verl fails here, named."""
    import importlib.util

    if importlib.util.find_spec("verl") is None:
        raise VerlRewardError(f"{INSTANCE_KEY} source 'default' needs verl on the EVAL workers "
                              f"(pip install 'hpc-rollout[verl]'): No module named 'verl'")


def _custom_source(path: str) -> str:
    """The operator's file, read (never imported) on the worker: it is run in the scorer sandbox."""
    file = Path(path)
    if not file.is_file():
        raise VerlRewardError(f"run.toml [rewards] verl_custom_path {path} does not exist on this worker")
    return file.read_text()


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
