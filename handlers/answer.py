"""`answer`: one reply of the policy to a verl row's prompt, scored by rule against its ground truth.

Instance: a verl row as it is, e.g. from the gsm8k parquet of verl's examples:
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "..."}],
     "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": {"index": 3}}
`prompt` is a list of chat messages (rendered with the model's chat template) or a string
(sent as raw text, no template). The rule (`match`, at the top level or in `extra_info`):
    number    (default) the number after the last '####' of the reply, else its last number,
              equals the ground truth as a number (gsm8k's convention)
    prefix    the reply starts with the ground truth
    exact     the stripped reply equals the stripped ground truth
Reward 1.0 or 0.0 (RULE below). A reply cut at the length limit (`stop_reason` `truncated`) is not
graded where its answer may have been cut off (`number`, `gsm8k`, `exact`): it earns run.toml
[rewards] truncated_reward (default 0); under `prefix` what is graded, the reply's start, is whole
whatever the cut, so it is graded. Sampling parameters come from
the job; an instance "sampling" object overrides them for that task (e.g. max_tokens).

With an instance key `verl_reward` (orchestrator/grading/verl_reward.py) the reply is scored by
verl's own default_compute_score or a custom reward function instead, at EVAL (in a scorer
sandbox of its own when the scorer may run the reply: verl's code and numina sources, any custom one).

The `number` rule vs verl's gsm8k scorer (`verl.utils.reward_score.gsm8k`, strict by default):
verl scores only a `#### N` in the reply's last 300 characters, compared as a string with the
ground truth (commas and `$` dropped); `number` also takes a reply without `####` by its last
number ("The answer is 72." scores 1.0 here, 0 in verl) and compares numbers ("72.0" = "72").
That leniency is on purpose for small models that never learnt the format; use `match: gsm8k`
for verl's strict rule, or `verl_reward: {"source": "default"}` for verl's function itself.
tests/verl/test_manager.py checks both against verl on one table of replies.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.handler_api.contract import AgentHandler
from orchestrator.grading.verl_reward import INSTANCE_KEY as VERL_REWARD, check_spec, score_with_verl
from orchestrator.handler_api.reward_rule import RewardRule
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key
from orchestrator.llm.conversation import Conversation
from orchestrator.llm.session import session_for

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext

MATCHES = ("number", "gsm8k", "prefix", "exact")
GSM8K_CLIP_CHARS = 300          # verl's gsm8k scorer reads only the reply's tail
GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
SCHEMA = InstanceSchema((
    instance_key("prompt", (Kind.LIST, Kind.STRING), "chat messages [{role, content}] (chat template) or raw text",
        required=True),
    instance_key("reward_model", Kind.OBJECT, "{'ground_truth': ...}: what the reply is scored against", required=True),
    instance_key("match", Kind.STRING, f"the rule: {', '.join(MATCHES)} (also in extra_info)", default="number"),
    instance_key("sampling", Kind.OBJECT, "sampling parameters for this task (over submit --sampling)", default={}),
    instance_key("verl_reward", Kind.OBJECT, "score with verl instead: {source: default} or {source: custom, reward_kwargs} (the function: run.toml [rewards])"),
), accepts_verl_rows=True)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
RULE = RewardRule(
    summary="1 when the reply's answer (by the row's `match` rule) equals reward_model.ground_truth, else 0",
    graded="the reply (one turn), by the row's `match`: `number` (default: the number after the last `####`, else "
           "the reply's last number; lenient on purpose: a reply ending in the right number scores 1), `gsm8k` "
           "(verl's strict rule: the last `#### N` of the reply's last 300 characters), `prefix`, `exact`",
    against="`reward_model.ground_truth` (numbers compared as numbers under `number`, as strings under `gsm8k`)",
    range="0 or 1",
    truncated="the reply was cut at the length limit (`stop_reason` `truncated`): run.toml [rewards] "
              "`truncated_reward` (default 0), not graded; under `prefix` graded (the reply's start is whole); "
              "with `verl_reward`: verl's scorer, as verl does",
    failed="no reward (null, status `failed`)",
    ground_truth="what the reply is scored against")


def match_rule(instance: dict[str, Any]) -> str:
    extra = given if isinstance(given := instance.get("extra_info"), dict) else {}
    return str(instance.get("match") or extra.get("match") or "number")


def check_instance(instance: dict[str, Any]) -> None:
    prompt = instance.get("prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("answer instance 'prompt' is an empty string")
    elif not (isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)):
        raise ValueError("answer instance needs 'prompt': a string or a non-empty list of {role, content}")
    reward_model = instance.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise ValueError("answer instance needs 'reward_model': {'ground_truth': ...} to score the reply")
    if match_rule(instance) not in MATCHES:
        raise ValueError(f"answer instance match {match_rule(instance)!r}; valid: {', '.join(MATCHES)}")
    if not isinstance(instance.get("sampling", {}), dict):
        raise ValueError("answer instance 'sampling' must be an object of sampling parameters")
    if VERL_REWARD in instance:
        check_spec(instance[VERL_REWARD])


def final_number(text: str) -> float | None:
    tail = text.rsplit("####", 1)[1] if "####" in text else text
    found = NUMBER.findall(tail)
    if not found:
        return None
    try:
        return float((found[0] if "####" in text else found[-1]).replace(",", ""))
    except ValueError:
        return None


def gsm8k_strict(reply: str, truth: str) -> float:
    """verl's gsm8k rule (strict): the last `#### N` of the reply's last 300 characters, as a string."""
    found = GSM8K_STRICT.findall(reply[-GSM8K_CLIP_CHARS:])
    return float(bool(found) and found[-1].replace(",", "").replace("$", "") == truth)


def score(reply: str, truth: str, rule: str) -> float:
    if rule == "gsm8k":
        return gsm8k_strict(reply, truth)
    if rule == "prefix":
        return float(reply.startswith(truth))
    if rule == "exact":
        return float(reply.strip() == truth.strip())
    got, wanted = final_number(reply), final_number(truth)
    return float(got is not None and wanted is not None and abs(got - wanted) < 1e-9)


class AnswerHandler(AgentHandler):
    name: ClassVar[str] = "answer"
    instance_schema = SCHEMA
    reward_rule = RULE

    def validate_instance(self, instance: dict[str, Any]) -> None:
        check_instance(instance)

    async def init(self, ctx: "JobContext") -> dict[str, Any]:
        check_instance(ctx.job.instance)
        return {}

    async def run(self, ctx: "JobContext", prepared: dict[str, Any]) -> dict[str, Any]:
        instance = ctx.job.instance
        sampling = {**ctx.job.sampling, **instance.get("sampling", {})}
        async with session_for(ctx) as llm:
            tokenizer = await llm.tokenizer()
            if isinstance(instance["prompt"], str):
                prompt_ids = list(tokenizer.encode(instance["prompt"], add_special_tokens=False))
            else:
                prompt_ids = Conversation(tokenizer, instance["prompt"]).prompt_ids
            turn = await llm.generate(prompt_ids, sampling)
        return one_turn_output(prompt_ids, turn, tokenizer)

    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        instance = ctx.job.instance
        if VERL_REWARD in instance:
            return await score_with_verl(instance[VERL_REWARD], instance, str(result.get("reply", "")), ctx)
        rule = match_rule(instance)
        if result.get("stop_reason") == "truncated" and rule != "prefix":   # its answer may be what was cut off
            return {"reward": ctx.services.rewards.truncated_reward, "graded": "truncated: not graded"}
        truth = str(instance["reward_model"]["ground_truth"])
        return {"reward": score(str(result.get("reply", "")), truth, rule)}


def one_turn_output(prompt_ids: list[int], turn: Any, tokenizer: Any) -> dict[str, Any]:
    """RUN's output of a single-turn reply: its ids, log-probs, turn records, text and stop reason."""
    records = turn.records()   # one per request: several when an abort split the reply
    return {
        "prompt_ids": prompt_ids,
        "response_ids": turn.output_ids,
        "response_mask": [1] * len(turn.output_ids),
        "logprobs": turn.logprobs,
        "turns": records,
        "reply": tokenizer.decode(turn.output_ids, skip_special_tokens=True),
        "stop_reason": "truncated" if turn.finish_reason == "length" else "finished",
        "policy_version_min": min(r["policy_version"] for r in records),
        "policy_version_max": max(r["policy_version"] for r in records),
    }
