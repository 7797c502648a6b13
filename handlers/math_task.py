"""`math`: a problem with a final answer (DeepScaleR style); the agent may compute with the
python tool (sympy and numpy in the task image) and answers with `submit` or a final \\boxed{}.

Rows: {"problem": "...", "answer": "391"} (also "question" / "ground_truth"), or verl rows
{"data_source": "math", "prompt": [...], "reward_model": {"ground_truth": "391"}, "extra_info": {...}}.
Optional: "image", "agent" (loop limits), "parser", "sampling".
Reward (RULE below, `hpc-rollout handlers math`): 1.0 when math-verify finds the answer equal to the
ground truth (3/4 = 0.75 = \\frac{6}{8}), else 0.0. The answer is what `submit` was given, else the
last \\boxed{} of the final reply; never other text (a number in free text is not an answer). A
final reply cut at the length limit ends the episode `truncated` and earns run.toml [rewards]
truncated_reward (default 0), ungraded.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hpc_rollout.handlers.task_rows import first_text, flatten, optional_image, prompt_messages
from orchestrator.agent.tool_handler import ToolAgentHandler, agent_task_keys
from orchestrator.agent.loop import AgentLimits, StopReason, TextReply
from orchestrator.grading.verl_reward import INSTANCE_KEY as VERL_REWARD, check_spec, decoded_response, score_with_verl
from orchestrator.handler_api.reward_rule import RewardRule
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext

SYSTEM = ("Solve the math problem. You can run Python with the python tool (sympy and numpy are "
          "installed). When you know the answer, call submit with it, or end your reply with the "
          "answer in \\boxed{}.")


LIMITS = AgentLimits(max_turns=8, max_context_tokens=4096, max_wall_s=300, tool_timeout_s=30,
                     max_observation_chars=2000, text_reply=TextReply.FINISH)
SCHEMA = InstanceSchema((
    instance_key("problem", Kind.STRING, "the problem statement (or 'question'; or a verl 'prompt')"),
    instance_key("question", Kind.STRING, "the problem statement, another name"),
    instance_key("answer", (Kind.STRING, Kind.NUMBER), "the final answer graded against (or verl reward_model.ground_truth)"),
    instance_key("ground_truth", (Kind.STRING, Kind.NUMBER), "the final answer, another name"),
    *agent_task_keys(LIMITS),
    instance_key("verl_reward", Kind.OBJECT, "score with verl instead: {source: default} or {source: custom, reward_kwargs} (the function: run.toml [rewards])"),
), accepts_verl_rows=True)


@dataclass(frozen=True)
class MathTask:
    problem: str
    answer: str
    prompt: tuple[dict[str, Any], ...] | None = None
    image: str | None = None


def math_task(instance: dict[str, Any]) -> MathTask:
    fields = flatten(instance)
    prompt = prompt_messages(fields)
    problem = first_text(fields, ("problem", "question")) or ""
    if prompt is None and not problem:
        raise ValueError("a math task needs 'problem' (or 'question'), or a verl 'prompt'")
    answer = fields.get("answer", fields.get("ground_truth"))
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError("a math task needs its answer: 'answer' (or verl reward_model.ground_truth)")
    return MathTask(problem, answer.strip(), tuple(prompt) if prompt else None, optional_image(fields))


MAX_ANSWER_CHARS = 1000   # longer answers are not parsed: no final answer is that long, a verifier's time is
RULE = RewardRule(
    summary="1 when the submitted answer (else the final reply's last \\boxed{}) equals the ground truth, else 0",
    graded="the answer given to `submit`, else the content of the last `\\boxed{}` of the final reply; never other "
           "text (a number in free text, a tool's output, an earlier reply); an answer over "
           f"{MAX_ANSWER_CHARS} characters is not parsed (0)",
    against="`answer` (verl: `reward_model.ground_truth`), equal by math-verify (`3/4` = `0.75` = `\\frac{6}{8}`); "
            "a check that takes over 10 s scores 0",
    range="0 or 1",
    truncated="the final reply was cut at the length limit (`stop_reason` `truncated`): run.toml [rewards] "
              "`truncated_reward` (default 0), not graded",
    failed="no reward (null, status `failed`: the backend or sandbox failed, cancelled); `max_turns`, "
           "`context_full` and `timeout` are graded as they stand",
    ground_truth="the answer graded against (unless `verl_reward` asks for verl's scorer)")


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} of `text` (braces balanced); None without one, or when
    the last one is never closed (a reply cut inside it)."""
    start = text.rfind("\\boxed")
    while start != -1:
        brace = start + len("\\boxed")
        while brace < len(text) and text[brace] == " ":
            brace += 1
        if brace < len(text) and text[brace] == "{":
            depth = 0
            for index in range(brace, len(text)):
                depth += {"{": 1, "}": -1}.get(text[index], 0)
                if depth == 0:
                    return text[brace + 1:index]
            return None
        start = text.rfind("\\boxed", 0, start)   # `\\boxed` without a brace (e.g. `\\boxedfoo`): look further back
    return None


def graded_answer(result: dict[str, Any]) -> tuple[str, str]:
    """(the answer as math-verify reads it, `$...$`, or "" for none; where it came from)."""
    answer, source = result.get("answer"), "submitted"
    if not (isinstance(answer, str) and answer.strip()):
        answer, source = last_boxed(str(result.get("final_text") or "")), "boxed"
    elif "\\boxed" in answer:
        answer = last_boxed(answer)
    answer = (answer or "").strip().strip("$").strip()
    return (f"${answer}$", source) if answer else ("", "nothing")


def candidate(result: dict[str, Any]) -> str:
    """What is graded (see RULE): the submitted answer, else the final reply's last \\boxed{}, as LaTeX."""
    return graded_answer(result)[0]


class MathHandler(ToolAgentHandler):
    name: ClassVar[str] = "math"
    instance_schema = SCHEMA
    reward_rule = RULE
    tools: ClassVar[tuple[str, ...]] = ("python", "think", "submit")
    limits: ClassVar[AgentLimits] = LIMITS

    def task(self, instance: dict[str, Any]) -> MathTask:
        return math_task(instance)

    def messages(self, task: MathTask) -> list[dict[str, Any]]:
        if task.prompt is not None:
            return [dict(m) for m in task.prompt]
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.problem}]

    def reference_result(self, task: MathTask, which: str) -> dict[str, Any]:
        return {"answer": task.answer if which == "golden" else "", "final_text": ""}

    def validate_instance(self, instance: dict[str, Any]) -> None:
        super().validate_instance(instance)
        if VERL_REWARD in instance:
            check_spec(instance[VERL_REWARD])

    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        from orchestrator.grading.math_answers import shared_verifier

        if VERL_REWARD in ctx.job.instance:   # verl's scorer on the decoded response (grading/verl_reward.py)
            text = await decoded_response(ctx.paths, result)
            return await score_with_verl(ctx.job.instance[VERL_REWARD], ctx.job.instance, text, ctx)
        task = self.task(ctx.job.instance)
        if result.get("stop_reason") == StopReason.TRUNCATED.value:
            return {"reward": ctx.services.rewards.truncated_reward, "graded": "truncated: not graded"}
        graded, source = graded_answer(result)
        if not graded:
            return {"reward": 0.0, "graded": "nothing: no submitted answer, no \\boxed{} in the final reply"}
        if len(graded) > MAX_ANSWER_CHARS:
            return {"reward": 0.0, "graded": source,
                    "grading_error": f"the answer is {len(graded)} characters; at most {MAX_ANSWER_CHARS} are parsed"}
        check = await asyncio.to_thread(shared_verifier().check, task.answer, graded)
        out = {"reward": 1.0 if check.correct else 0.0, "graded": source, "parsed_answer": check.answer,
               "parsed_gold": check.gold}
        if check.error:
            out["grading_error"] = check.error
        return out
