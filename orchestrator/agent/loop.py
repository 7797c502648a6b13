"""The turn loop: sample, parse, run the tools, append the observations, until a stop.

    result = await run_agent(llm, conversation, toolbox, parse=get_parser("hermes"),
                             limits=AgentLimits(max_turns=20), sampling={"max_tokens": 512})

`llm` is anything with `async generate(prompt_ids, sampling) -> Turn` (an LLMSession).
`conversation` is the token buffer (orchestrator/llm/conversation.py): sampled ids are kept
verbatim (mask 1), observations are the chat template's rendering of the new `tool` messages
only (mask 0). The loop stops for one recorded reason (StopReason); it never raises for what
the model does (malformed calls, unknown tools, huge outputs, hung commands) — only for a dead
backend or sandbox, after marking the run `error`.
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Protocol

from orchestrator.agent.calls import ParsedReply
from orchestrator.agent.context import (
    SUMMARY_REQUEST, ContextMode, ContextPolicy, dropped, fresh_conversation, split_turns, summarized,
)
from orchestrator.agent.messages import (
    assistant_message, error_message, nudge_message, reply_text, tool_message, with_call_ids,
)
from orchestrator.agent.toolbox import ToolOutcome
from orchestrator.settings_spec import Family, Numbers, checked, setting

if TYPE_CHECKING:
    from orchestrator.llm.conversation import Conversation

RECORD_OUTPUT_CHARS = 1000   # what a call record keeps of the observation, for `inspect`


class StopReason(str, enum.Enum):
    FINISHED = "finished"          # submit/finish called, or (text_reply=finish) a reply without calls
    TRUNCATED = "truncated"        # (text_reply=finish) the final reply was cut at the length limit
    MAX_TURNS = "max_turns"
    CONTEXT_FULL = "context_full"
    TIMEOUT = "timeout"            # the loop's wall-clock limit (or the job's budget)
    ERROR = "error"                # the backend or the sandbox failed
    CANCELLED = "cancelled"


class TextReply(str, enum.Enum):
    """What a reply without any tool call means."""

    FINISH = "finish"   # the final answer (math: the boxed answer is in the text)
    NUDGE = "nudge"     # a slip: remind the model to use a tool (code, swe)


# Any int or float (a whole number's field keeps int(value)), never a bool: what the agent always took.
AGENT = Family("agent setting", "agent {key}", numbers=Numbers.TRUNCATE, show_help=True)


@dataclass(frozen=True)
class AgentLimits:
    max_turns: int = setting(20, "LLM calls at most", bounds=(1, 10_000))
    max_context_tokens: int = setting(8192, "prompt + reply tokens at most", bounds=(16, 10_000_000))
    max_wall_s: float = setting(1800.0, "seconds of RUN at most", bounds=(0.1, 7 * 86400))
    tool_timeout_s: float = setting(60.0, "seconds per tool call", bounds=(0.1, 86400))
    max_tokens_per_turn: int = setting(1024, "tokens sampled per call at most", bounds=(1, 1_000_000))
    max_observation_chars: int = setting(
        8000, "a tool's output beyond this is cut in the middle", bounds=(64, 10_000_000))
    text_reply: TextReply = setting(TextReply.FINISH, "what a reply without a tool call means")

    @classmethod
    def parse(cls, base: "AgentLimits", overrides: dict[str, Any] | None) -> "AgentLimits":
        """`base` with `overrides` (from a task's "agent" object), each checked."""
        return replace(base, **checked(cls, overrides or {}, AGENT))


@dataclass(frozen=True)
class ToolCallRecord:
    turn: int
    name: str
    arguments: str                 # JSON
    exit_code: int | None
    output_chars: int
    latency_ms: float
    error: str | None
    output: str                    # head + tail of the observation, for people

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AgentRun:
    """The state of one run; readable mid-way (a stage timeout keeps what was done)."""

    conversation: "Conversation"
    turns: list[dict[str, Any]] = field(default_factory=list)   # one record per request (llm/session.py)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    malformed_calls: int = 0
    stop_reason: StopReason | None = None
    answer: str | None = None          # submit's answer
    final_text: str = ""               # the last reply's text (calls removed)
    error: str | None = None
    replies: int = 0                   # model replies (a reply an abort split is one, over two turns)
    turn_rewards: list[float | None] = field(default_factory=list)   # aligned with turns: process rewards
    segments: list[list[int]] = field(default_factory=lambda: [[]])  # indices of turns, one list per context
    compactions: list[dict[str, Any]] = field(default_factory=list)  # what each context change did
    head: int = -1                     # how many first messages (system, task) every context keeps

    def __post_init__(self) -> None:
        if self.head < 0:
            self.head = len(self.conversation.messages)

    def add_turn(self, turn: Any, counts: bool = True) -> None:
        """Record a reply: one record per request the backend received. A reply that `counts` is
        an agent step (max_turns); a summary the loop asked for is not."""
        records = turn.records() if hasattr(turn, "records") else [turn.to_json()]
        for record in records:
            self.segments[-1].append(len(self.turns))
            self.turns.append(record)
            self.turn_rewards.append(None)
        self.replies += counts

    def add_turn_reward(self, reward: Any) -> None:
        """Add a process reward to the last turn (a reply's rewards add up)."""
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise TypeError(f"a tool reward must be a finite number or None, got {reward!r}")
        self.turn_rewards[-1] = (self.turn_rewards[-1] or 0.0) + float(reward)

    def to_json(self) -> dict[str, Any]:
        versions = [t["policy_version"] for t in self.turns if t.get("policy_version") is not None]
        out = {
            **self.conversation.to_json(),
            "turns": self.turns,
            "tool_calls": [r.to_json() for r in self.tool_calls],
            "malformed_calls": self.malformed_calls,
            "stop_reason": (self.stop_reason or StopReason.ERROR).value,
            "answer": self.answer,
            "final_text": self.final_text,
        }
        if versions:
            out["policy_version_min"], out["policy_version_max"] = min(versions), max(versions)
        if any(r is not None for r in self.turn_rewards):
            out["turn_rewards"] = list(self.turn_rewards)
        if self.compactions:   # several contexts: each a training sample (orchestrator/proxy/trajectory.py)
            out.update({"builder": "prefix_merging", "samples": [s for s in self.segments if s],
                        "context_compactions": self.compactions})
        if self.error:
            out["agent_error"] = self.error
        return out


class LLM(Protocol):
    async def generate(self, prompt_ids: list[int], sampling: dict[str, Any] | None = None) -> Any: ...


class Toolbox(Protocol):
    @property
    def names(self) -> list[str]: ...

    def problems(self, call: Any) -> list[str]: ...

    async def execute(self, call: Any, timeout: float) -> ToolOutcome: ...


ToolReward = Callable[[ToolCallRecord, ToolOutcome], "float | None"]


async def run_agent(
    llm: LLM, run: AgentRun, toolbox: Toolbox, *, parse: Callable[[str], ParsedReply],
    limits: AgentLimits, sampling: dict[str, Any] | None = None,
    on_tool_call: Callable[[ToolCallRecord], None] | None = None,
    context: ContextPolicy = ContextPolicy(), tool_reward: ToolReward | None = None,
) -> AgentRun:
    """Run turns until a stop reason; the result is `run`, updated in place as it goes.

    `context` makes room in a full context (agent/context.py) instead of stopping; `tool_reward`
    gives a process reward per tool result (None: none), added to the turn that made the call.
    """
    sampling = dict(sampling or {})
    wanted_tokens = int(sampling.get("max_tokens") or limits.max_tokens_per_turn)
    started = time.monotonic()

    def remaining() -> float:
        return limits.max_wall_s - (time.monotonic() - started)

    while run.stop_reason is None:
        conversation = run.conversation
        room = limits.max_context_tokens - _tokens(conversation)
        run.stop_reason = _limit_before_turn(run, limits, room, remaining())
        if run.stop_reason is not None:
            break
        try:
            # asyncio.timeout, not wait_for: no task per turn (3.11's wait_for makes one).
            async with asyncio.timeout(remaining()):
                turn = await llm.generate(conversation.input_ids, {**sampling, "max_tokens": min(wanted_tokens, room)})
        except TimeoutError:
            run.stop_reason = StopReason.TIMEOUT
            break
        run.add_turn(turn)
        parsed = _add_reply(run, turn, parse)
        calls = with_call_ids(parsed.calls, len(run.turns))
        conversation.describe_last_assistant(assistant_message(parsed, calls))
        run.final_text = parsed.content
        if not turn.output_ids:   # nothing sampled: the backend had no room left
            run.stop_reason = StopReason.CONTEXT_FULL
            break
        tools = await _call_tools(run, toolbox, parsed, calls, limits, remaining, on_tool_call, tool_reward)
        if run.stop_reason is None:
            run.stop_reason = await _next_context(llm, run, turn, toolbox, tools, parse, limits, context, sampling,
                                                  wanted_tokens)
    return run


def _limit_before_turn(run: AgentRun, limits: AgentLimits, room: int, remaining_s: float) -> StopReason | None:
    """Why no further turn may start: the turn limit, a full context, the wall clock; None if none."""
    if run.replies >= limits.max_turns:
        return StopReason.MAX_TURNS
    if room <= 0:
        return StopReason.CONTEXT_FULL
    if remaining_s <= 0:
        return StopReason.TIMEOUT
    return None


@dataclass
class _ToolRound:
    """What a reply's tool calls gave: the observations for the next turn, whether one ended the
    episode, and the summary a tool left for a context to be made from (agent/context.py)."""

    observations: list[dict[str, Any]]
    ended: bool = False
    summary: str | None = None


async def _call_tools(run: AgentRun, toolbox: Toolbox, parsed: ParsedReply, calls: list[Any], limits: AgentLimits,
                      remaining: Callable[[], float], on_tool_call: Callable[[ToolCallRecord], None] | None,
                      tool_reward: ToolReward | None) -> _ToolRound:
    """Run a reply's tool calls in order, recording each; a malformed call is told, not run.
    Sets run.stop_reason when the wall clock runs out between calls; an ending call ends the round."""
    round_ = _ToolRound([error_message(error) for error in parsed.errors])
    run.malformed_calls += len(parsed.errors)
    for call in calls:
        if remaining() <= 0:
            run.stop_reason = StopReason.TIMEOUT
            return round_
        began = time.monotonic()
        if toolbox.problems(call):   # unknown tool or bad arguments: malformed, not executed
            run.malformed_calls += 1
        outcome = await toolbox.execute(call, max(0.1, min(limits.tool_timeout_s, remaining())))
        record = ToolCallRecord(
            turn=len(run.turns), name=call.name, arguments=call.arguments_json,
            exit_code=outcome.exit_code, output_chars=outcome.output_chars or len(outcome.observation),
            latency_ms=round((time.monotonic() - began) * 1000, 3), error=outcome.error,
            output=_preview(outcome.observation),
        )
        run.tool_calls.append(record)
        if on_tool_call is not None:
            on_tool_call(record)
        if tool_reward is not None and (reward := tool_reward(record, outcome)) is not None:
            run.add_turn_reward(reward)
        if outcome.ends_episode:
            run.answer = outcome.answer
            round_.ended = True
            return round_
        round_.summary = outcome.summary if outcome.summary is not None else round_.summary
        round_.observations.append(tool_message(call, outcome.observation))
    return round_


async def _next_context(llm: LLM, run: AgentRun, turn: Any, toolbox: Toolbox, tools: _ToolRound,
                        parse: Callable[[str], ParsedReply], limits: AgentLimits, context: ContextPolicy,
                        sampling: dict[str, Any], wanted_tokens: int) -> StopReason | None:
    """The observations put in the conversation for the next turn (room made first when the context
    is crowded or a tool summarised it); the stop reason when the episode ends here, else None."""
    if tools.ended:
        return StopReason.FINISHED
    observations = tools.observations
    if not observations:
        if limits.text_reply is TextReply.FINISH:   # a cut reply is no final answer: graders see why it ended
            return StopReason.TRUNCATED if turn.finish_reason == "length" else StopReason.FINISHED
        observations.append(nudge_message(toolbox.names))
    conversation = run.conversation
    ids = conversation.render_new(observations)
    after = _tokens(conversation) + len(ids)
    crowded = context.mode is not ContextMode.NONE and after + wanted_tokens > context.budget(limits.max_context_tokens)
    if tools.summary is None and not crowded:
        if after >= limits.max_context_tokens:
            return StopReason.CONTEXT_FULL   # no room to show the results and reply
        conversation.append_rendered(observations, ids)
        return None
    if not await _make_room(llm, run, observations, context, limits, sampling, parse, tools.summary, wanted_tokens):
        return StopReason.CONTEXT_FULL
    return None


def _tokens(conversation: "Conversation") -> int:
    """len(conversation.input_ids) without building that list (a fresh copy each time it is read)."""
    return len(conversation.prompt_ids) + len(conversation.response_ids)


def _add_reply(run: AgentRun, turn: Any, parse: Callable[[str], ParsedReply]) -> ParsedReply:
    conversation = run.conversation
    conversation.add_assistant(turn.output_ids, turn.logprobs, turn.finish_reason)
    return parse(reply_text(conversation.tokenizer, turn.output_ids, turn.finish_reason))


async def _make_room(llm: LLM, run: AgentRun, observations: list[dict[str, Any]], context: ContextPolicy,
                     limits: AgentLimits, sampling: dict[str, Any], parse: Callable[[str], ParsedReply],
                     summary: str | None, wanted_tokens: int) -> bool:
    """Start a new context (agent/context.py) after this turn's observations; False when no
    context the policy allows leaves room for a reply. `summary`: the summarize tool's."""
    old = run.conversation
    budget = context.budget(limits.max_context_tokens)
    tokens_before = len(old.input_ids)
    asked = summary is None and context.mode is ContextMode.SUMMARIZE
    if asked:
        summary = await _ask_summary(llm, run, observations, context, limits, sampling, parse)
        asked = summary is not None
    # The observations are the current turn's last messages; a summary exchange (request, reply)
    # was appended to the old context and is not a turn to keep.
    messages = list(old.messages[:-2]) if asked else [*old.messages, *observations]
    turns = split_turns(messages, run.head)
    head = messages[:run.head]

    def fits(candidate: "Conversation") -> bool:
        return len(candidate.input_ids) + wanted_tokens <= budget

    fresh = None
    if summary is not None:
        for keep in range(min(context.keep_turns, len(turns)), -1, -1):
            candidate = fresh_conversation(old, summarized(head, turns, keep, summary))
            if fits(candidate):
                fresh = candidate
                break
    if fresh is None:   # drop (or a summary that leaves no room)
        fresh = _dropped_fitting(old, head, turns, context.keep_turns, fits)
    if fresh is None:
        return False
    run.conversation = fresh
    run.segments.append([])
    run.compactions.append({"after_turn": len(run.turns), "mode": "summarize" if summary is not None else "drop",
                            "tokens_before": tokens_before, "tokens_after": len(fresh.input_ids),
                            "turns_before": len(turns)})
    return True


def _dropped_fitting(old: "Conversation", head: list[dict[str, Any]], turns: list[list[dict[str, Any]]],
                     keep_turns: int, fits: Callable[["Conversation"], bool]) -> "Conversation | None":
    """The least cut drop that fits: most kept turns first, then the fewest old turns left out
    (a binary search: leaving more out only shortens)."""
    for keep in range(min(keep_turns, len(turns)), -1, -1):
        old_turns = len(turns) - keep

        def build(gone: int) -> "Conversation":
            return fresh_conversation(old, dropped(head, turns, keep, gone))

        last = build(old_turns)
        if not fits(last):
            continue
        low, high, best = 0, old_turns, last   # fits(high) holds
        while low < high:
            middle = (low + high) // 2
            candidate = build(middle)
            if fits(candidate):
                high, best = middle, candidate
            else:
                low = middle + 1
        return best
    return None


async def _ask_summary(llm: LLM, run: AgentRun, observations: list[dict[str, Any]], context: ContextPolicy,
                       limits: AgentLimits, sampling: dict[str, Any], parse: Callable[[str], ParsedReply]) -> str | None:
    """Show this turn's observations and the summary request, and let the policy write the summary
    (a turn of its own); None when there is no room for it (then old turns are dropped)."""
    conversation = run.conversation
    request = [*observations, {"role": "user", "content": SUMMARY_REQUEST}]
    ids = conversation.render_new(request)
    room = min(context.summary_tokens, limits.max_context_tokens - len(conversation.input_ids) - len(ids))
    if room < 8:
        return None
    conversation.append_rendered(request, ids)
    turn = await llm.generate(conversation.input_ids, {**sampling, "max_tokens": room})
    run.add_turn(turn, counts=False)
    parsed = _add_reply(run, turn, parse)
    conversation.describe_last_assistant({"role": "assistant", "content": parsed.content})
    return parsed.content


def _preview(text: str) -> str:
    if len(text) <= RECORD_OUTPUT_CHARS:
        return text
    half = RECORD_OUTPUT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters not recorded ...]\n{text[-half:]}"
