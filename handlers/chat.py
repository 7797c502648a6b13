"""`chat`: a multi-turn conversation with the policy, no tools and no sandbox.

Instance: {"messages": [{"role": ..., "content": ...}, ...], "user_turns": ["...", ...]}.
The model answers `messages`; after each reply the next user turn is appended, until the
user turns run out. Sampling parameters come from the job (`submit --sampling`); an optional
instance key "sampling" overrides them for that task (e.g. a per-task max_tokens).

Reward (deterministic, from the trajectory alone): the share of letters and spaces in the
assistant replies, in [0, 1]: a stand-in for "answers in prose" that differs between
samples of a random model, so groups carry signal. Replace it in your own handler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.handler_api.contract import AgentHandler
from orchestrator.llm.conversation import Conversation
from orchestrator.llm.session import session_for

if TYPE_CHECKING:
    from orchestrator.handler_api.context import JobContext

ROLES = ("system", "user", "assistant", "tool")


def check_instance(instance: dict[str, Any]) -> None:
    messages = instance.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("chat instance needs 'messages': a non-empty list of {role, content}")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES \
                or not isinstance(message.get("content"), str):
            raise ValueError(
                f"chat instance messages[{index}] must be {{'role': one of {', '.join(ROLES)}, "
                f"'content': str}}, got {message!r}"
            )
    if not isinstance(instance.get("sampling", {}), dict):
        raise ValueError("chat instance 'sampling' must be an object of sampling parameters")
    turns = instance.get("user_turns", [])
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise ValueError("chat instance 'user_turns' must be a list of strings")


def prose_share(texts: list[str]) -> float:
    joined = "".join(texts)
    if not joined:
        return 0.0
    return sum(ch.isalpha() or ch == " " for ch in joined) / len(joined)


class ChatHandler(AgentHandler):
    name: ClassVar[str] = "chat"

    def validate_instance(self, instance: dict[str, Any]) -> None:
        check_instance(instance)

    async def init(self, ctx: "JobContext") -> dict[str, Any]:
        check_instance(ctx.job.instance)
        return {"user_turns": len(ctx.job.instance.get("user_turns", []))}

    async def run(self, ctx: "JobContext", prepared: dict[str, Any]) -> dict[str, Any]:
        instance = ctx.job.instance
        user_turns: list[str] = list(instance.get("user_turns", []))
        sampling = {**ctx.job.sampling, **instance.get("sampling", {})}
        turns: list[dict[str, Any]] = []
        replies: list[str] = []
        async with session_for(ctx) as llm:
            conversation = Conversation(await llm.tokenizer(), instance["messages"])
            for index in range(len(user_turns) + 1):
                turn = await llm.generate(conversation.input_ids, sampling)
                replies.append(conversation.add_assistant(turn.output_ids, turn.logprobs, turn.finish_reason))
                turns.extend(turn.records())   # several when an abort split the reply
                if not turn.output_ids:  # the context is full: nothing more can be said
                    break
                if index < len(user_turns):
                    conversation.add_messages([{"role": "user", "content": user_turns[index]}])
        versions = [t["policy_version"] for t in turns]
        return {
            **conversation.to_json(),
            "turns": turns,
            "replies": replies,
            "policy_version_min": min(versions),
            "policy_version_max": max(versions),
            "backend_switches": llm.failed,
        }

    async def eval(self, ctx: "JobContext", result: dict[str, Any]) -> dict[str, Any]:
        return {"reward": prose_share(list(result.get("replies", [])))}
