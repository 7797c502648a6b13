"""`reasoning_gym`: one question of one of reasoning-gym's procedural datasets, one reply, scored by
the dataset's own `score_answer` (docs/agents.md "Bring your environment: reasoning-gym").

Instance: {"dataset": "leg_counting", "seed": 1, "size": 100, "index": 7, "options": {...}}, the
options going to reasoning-gym's create_dataset; `hpc-rollout tasks reasoning-gym NAME` (or
`reasoning_gym_rows`) writes them. Submit builds the dataset (unknown names and bad options are
refused with the close names, or the dataset's own error); INIT generates the entry; RUN asks
the policy (reasoning-gym's system prompt, then the question; the job's sampling, an instance
`sampling` over it); EVAL grades the reply's last `<answer>...</answer>` (reasoning_gym_answers.py)
with the dataset's scorer. Scorers other than reasoning-gym's default string comparison run in
a scorer sandbox (orchestrator/grading/scorer_sandbox.py): several hand the answer to eval().
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hpc_rollout.handlers import reasoning_gym_data as data
from hpc_rollout.handlers.answer import one_turn_output
from hpc_rollout.handlers.reasoning_gym_answers import extract_answer, refusal
from orchestrator.grading.scorer_sandbox import ScorerCall, ScorerSandboxError, refuse_local, run_sandboxed
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.handler_api.reward_rule import RewardRule
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key
from orchestrator.llm.conversation import Conversation
from orchestrator.llm.session import session_for

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext

SCORER_FILE = Path(__file__).with_name("reasoning_gym_scorer.py")
# reasoning_gym.utils.SYSTEM_PROMPTS, by name (a row picks one of reasoning-gym's, never writes its own).
SYSTEM_PROMPTS = ("default", "DeepSeekZero", "simple", "direct", "chain_of_draft", "none")
SCHEMA = InstanceSchema((
    instance_key("dataset", Kind.STRING, "one of reasoning-gym's datasets (`hpc-rollout tasks reasoning-gym --list`)",
                 required=True),
    instance_key("seed", Kind.INTEGER, "the dataset's seed", required=True),
    instance_key("size", Kind.INTEGER, "the dataset's size", required=True),
    instance_key("index", Kind.INTEGER, "the entry: 0 to size - 1", required=True),
    instance_key("options", Kind.OBJECT, "the dataset's options (reasoning-gym's create_dataset keywords)", default={}),
    instance_key("system_prompt", Kind.STRING, f"reasoning-gym's system prompt: {', '.join(SYSTEM_PROMPTS)}",
                 default="default"),
    instance_key("sampling", Kind.OBJECT, "sampling parameters for this task (over submit --sampling)", default={}),
))
RULE = RewardRule(
    summary="the dataset's own score_answer of the reply's last <answer>...</answer>, in [0, 1]",
    graded="the text of the reply's last `<answer>...</answer>` (reasoning-gym's convention; nested tags: the "
           "innermost); none: 0; an answer over max(2000, 4 x the expected answer's length) characters, or one that "
           "copies 48 characters of the question the expected answer does not hold (an echo): 0, not scored",
    against="the entry the row names, by its dataset's `score_answer` (reasoning-gym's default: 1 when equal, "
            "len(truth)/len(answer) when the answer holds the truth; puzzles check the answer's validity); scorers "
            "other than the default run in a scorer sandbox (refused under the `local` runtime)",
    range="[0, 1]",
    truncated="the reply was cut at the length limit (`stop_reason` `truncated`): run.toml [rewards] "
              "`truncated_reward` (default 0), not graded",
    failed="no reward (null, status `failed`)",
    ground_truth=None)


def spec_of(instance: dict[str, Any]) -> data.EntrySpec:
    spec = data.EntrySpec.of(instance)
    prompt = instance.get("system_prompt", "default")
    if prompt not in SYSTEM_PROMPTS:
        raise ValueError(f"reasoning_gym system_prompt {prompt!r}; valid: {', '.join(SYSTEM_PROMPTS)}")
    if not isinstance(instance.get("sampling", {}), dict):
        raise ValueError("reasoning_gym 'sampling' must be an object of sampling parameters")
    return spec


def messages(question: str, system_prompt: str) -> list[dict[str, str]]:
    from reasoning_gym.utils import SYSTEM_PROMPTS as THEIRS

    system = [] if system_prompt == "none" else [{"role": "system", "content": THEIRS[system_prompt]}]
    return [*system, {"role": "user", "content": question}]


class ReasoningGymHandler(AgentHandler):
    name: ClassVar[str] = "reasoning_gym"
    instance_schema = SCHEMA
    reward_rule = RULE

    def validate_instance(self, instance: dict[str, Any]) -> None:
        data.check_spec(spec_of(instance))

    async def init(self, ctx: "JobContext") -> dict[str, Any]:
        instance = ctx.job.instance
        # Off the event loop: the first import takes seconds, some generators seconds per entry.
        made = await asyncio.to_thread(data.entry, spec_of(instance))
        # JSON as the ticket carries it (int dict keys, tuples, numpy floats): for EVAL's fallback.
        carried = json.loads(json.dumps(made, default=str))
        return {"question": made["question"], "entry": carried,
                "messages": messages(made["question"], instance.get("system_prompt", "default"))}

    def task(self, instance: dict[str, Any]) -> dict[str, Any]:
        """The entry with what EVAL reads of it (for `hpc-rollout tasks check`)."""
        made = data.entry(spec_of(instance))
        return {"question": made["question"], "entry": json.loads(json.dumps(made, default=str))}

    def reference_result(self, task: dict[str, Any], which: str) -> dict[str, Any]:
        """A RUN result answering with the expected answer ("golden") or nothing ("noop")."""
        truth = task["entry"].get("answer")
        if which == "golden" and not isinstance(truth, str):
            raise NotImplementedError("this dataset has no single expected answer (its scorer checks a solution): "
                                      "no golden reply to check")
        reply = f"<answer>{truth}</answer>" if which == "golden" else ""
        return {**task, "reply": reply, "stop_reason": "finished"}

    def carried(self, prepared: dict[str, Any]) -> dict[str, Any]:
        """What RUN passes on to EVAL of INIT's output (EVAL sees RUN's output only)."""
        return {"question": prepared["question"], "entry": prepared["entry"]}

    async def run(self, ctx: "JobContext", prepared: dict[str, Any]) -> dict[str, Any]:
        sampling = {**ctx.job.sampling, **ctx.job.instance.get("sampling", {})}
        async with session_for(ctx) as llm:
            tokenizer = await llm.tokenizer()
            prompt_ids = Conversation(tokenizer, prepared["messages"]).prompt_ids
            turn = await llm.generate(prompt_ids, sampling)
        return {**self.carried(prepared), **one_turn_output(prompt_ids, turn, tokenizer)}

    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        if result.get("stop_reason") == "truncated":   # its answer may be what was cut off
            return {"reward": ctx.services.rewards.truncated_reward, "graded": "truncated: not graded"}
        answer = extract_answer(str(result.get("reply", "")))
        if answer is None:
            return {"reward": 0.0, "graded": "nothing: no <answer>...</answer> in the reply"}
        entry, question = dict(result["entry"]), str(result["question"])
        refused = refusal(answer, question, entry.get("answer"))
        if refused:
            return {"reward": 0.0, "graded": refused}
        scored = await self.score(ctx, spec_of(ctx.job.instance), question, entry, answer)
        return {"reward": scored["score"], "graded": "answer tag", "answer": answer[:200], **scored}

    def code_scorer(self, instance: dict[str, Any]) -> str | None:
        spec = spec_of(instance)
        return None if data.scored_in_process(spec.dataset) else f"reasoning-gym's {spec.dataset} scorer"

    async def score(self, ctx: "JobContext", spec: data.EntrySpec, question: str, entry: dict[str, Any],
                    answer: str) -> dict[str, Any]:
        """{"score", "entry", "scorer"}: the dataset's score_answer, in this process or a scorer sandbox."""
        await asyncio.to_thread(data.check_spec, spec)   # imports reasoning-gym once per process (seconds)
        if data.scored_in_process(spec.dataset):   # string comparisons only: the carried entry's answer suffices
            made = data.dataset(spec)
            return {"score": float(made.score_answer(answer=answer, entry=entry)), "entry": "carried",
                    "scorer": "in process"}
        call = {"dataset": spec.dataset, "module": data.dataset_module(spec.dataset), "seed": spec.seed,
                "size": spec.size, "index": spec.index, "options": dict(spec.options), "question": question,
                "entry": entry, "answer": answer}
        try:
            refuse_local(ctx.services.runtime, f"reasoning-gym's {spec.dataset} scorer")
        except ScorerSandboxError as exc:
            raise ScorerSandboxError(f"{exc}; reasoning-gym datasets scored in process (its default scorer) run "
                                     f"anywhere") from None
        found = await run_sandboxed(ctx, ScorerCall("score", call, file_text=SCORER_FILE.read_text(),
                                                    packages=("reasoning_gym",)))
        if not isinstance(found, dict) or not isinstance(found.get("score"), (int, float)):
            raise ScorerSandboxError(f"reasoning-gym's {spec.dataset} scorer returned {str(found)[:200]}")
        return {"score": float(found["score"]), "entry": str(found.get("entry")), "scorer": "scorer sandbox"}
