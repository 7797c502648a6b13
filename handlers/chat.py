"""`chat`: a multi-turn conversation with the policy, no tools and no sandbox.

Instance (SCHEMA below): {"messages": [{"role": ..., "content": ...}, ...], "user_turns": ["...", ...]}.
The model answers `messages`; after each reply the next user turn is appended, until the
user turns run out. A verl row (`{"data_source": "chat", "prompt": [...], "reward_model": ...,
"extra_info": ...}`, the README's example) is taken as it is: its `prompt` (chat messages, or a
string for one user message) is the conversation when there are no `messages`. Sampling parameters come from the job (`submit --sampling`); an optional
instance key "sampling" overrides them for that task (e.g. a per-task max_tokens).

Reward (deterministic, from the trajectory alone; RULE below): the share of letters and spaces in
the assistant replies, in [0, 1]: a stand-in for "answers in prose" that differs between
samples of a random model, so groups carry signal. Replace it in your own handler. It uses no
ground truth: a row with `reward_model` is refused at submit (naming the handlers that would use
it) unless it asks for verl's scorer (`verl_reward`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from hpc_rollout.handlers.task_rows import prompt_messages
from orchestrator.handler_api.contract import AgentHandler
from orchestrator.handler_api.reward_rule import RewardRule
from orchestrator.handler_api.schema import InstanceSchema, Kind, instance_key
from orchestrator.llm.conversation import Conversation
from orchestrator.llm.session import session_for
from orchestrator.grading.verl_reward import INSTANCE_KEY as VERL_REWARD, check_spec, score_with_verl

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext

ROLES = ("system", "user", "assistant", "tool")
SCHEMA = InstanceSchema((
    instance_key("messages", Kind.LIST, f"the conversation so far: [{{role: {'|'.join(ROLES)}, content: str}}, ...] "
                 "(or a verl row's 'prompt')"),
    instance_key("user_turns", Kind.LIST, "user messages appended after each reply, until they run out", default=[]),
    instance_key("sampling", Kind.OBJECT, "sampling parameters for this task (over submit --sampling)", default={}),
    instance_key("verl_reward", Kind.OBJECT, "score with verl instead: {source: default} or {source: custom, reward_kwargs} (the function: run.toml [rewards])"),
), accepts_verl_rows=True)


RULE = RewardRule(
    summary="the share of letters and spaces in the replies, in [0, 1] (a stand-in, no ground truth)",
    graded="the assistant replies' text: the share of letters and spaces in it, a stand-in that differs between "
           "samples of a random model, not a verifiable reward",
    against="nothing: a row with `reward_model` is refused at submit unless it asks for `verl_reward` (verl's "
            "scorer on the decoded response)",
    range="[0, 1]",
    truncated="graded as it stands",
    failed="no reward (null, status `failed`)",
    ground_truth=None)


def chat_messages(instance: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation to start from: `messages`, else a verl row's `prompt`; checked."""
    if "messages" not in instance and instance.get("prompt") is not None:
        return prompt_messages(instance) or []
    messages = instance.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("chat instance needs 'messages': a non-empty list of {role, content} "
                         "(or a verl row's 'prompt')")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES \
                or not isinstance(message.get("content"), str):
            raise ValueError(
                f"chat instance messages[{index}] must be {{'role': one of {', '.join(ROLES)}, "
                f"'content': str}}, got {message!r}"
            )
    return messages


def check_instance(instance: dict[str, Any]) -> None:
    chat_messages(instance)
    if not isinstance(instance.get("sampling", {}), dict):
        raise ValueError("chat instance 'sampling' must be an object of sampling parameters")
    turns = instance.get("user_turns", [])
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise ValueError("chat instance 'user_turns' must be a list of strings")
    if VERL_REWARD in instance:
        check_spec(instance[VERL_REWARD])


def prose_share(texts: list[str]) -> float:
    joined = "".join(texts)
    if not joined:
        return 0.0
    return sum(ch.isalpha() or ch == " " for ch in joined) / len(joined)


class ChatHandler(AgentHandler):
    name: ClassVar[str] = "chat"
    instance_schema = SCHEMA
    reward_rule = RULE

    def ignored_reward_model(self, instance: dict[str, Any]) -> str | None:
        return None if VERL_REWARD in instance else super().ignored_reward_model(instance)

    def validate_instance(self, instance: dict[str, Any]) -> None:
        check_instance(instance)

    async def init(self, ctx: "JobContext") -> dict[str, Any]:
        check_instance(ctx.job.instance)
        return {"user_turns": len(ctx.job.instance.get("user_turns", []))}

    async def run(self, ctx: "JobContext", prepared: dict[str, Any]) -> dict[str, Any]:
        instance = ctx.job.instance
        user_turns: list[str] = list(SCHEMA.value(instance, "user_turns"))
        sampling = {**ctx.job.sampling, **SCHEMA.value(instance, "sampling")}
        turns: list[dict[str, Any]] = []
        replies: list[str] = []
        async with session_for(ctx) as llm:
            tokenizer = await llm.tokenizer()
            conversation = Conversation(tokenizer, chat_messages(instance))
            for index in range(len(user_turns) + 1):
                turn = await llm.generate(conversation.input_ids, sampling)
                replies.append(conversation.add_assistant(turn.output_ids, turn.logprobs, turn.finish_reason))
                turns.extend(turn.records())   # several when an abort split the reply
                if not turn.output_ids:  # the context is full: nothing more can be said
                    break
                if index < len(user_turns):
                    conversation.add_messages([{"role": "user", "content": user_turns[index]}])
        versions = [t["policy_version"] for t in turns]
        trajectory = conversation.to_json()
        if VERL_REWARD in instance:   # what verl's reward managers score: the decoded response
            trajectory["response_text"] = tokenizer.decode(list(trajectory["response_ids"]), skip_special_tokens=True)
        return {
            **trajectory,
            "turns": turns,
            "replies": replies,
            "policy_version_min": min(versions),
            "policy_version_max": max(versions),
            "backend_switches": llm.failed,
        }

    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        if VERL_REWARD in ctx.job.instance:
            return await score_with_verl(ctx.job.instance[VERL_REWARD], ctx.job.instance,
                                         str(result.get("response_text", "")), ctx)
        return {"reward": prose_share(list(result.get("replies", [])))}
