"""One job's calls: messages in, token ids to the backend, an OpenAI reply out, all recorded.

A call whose messages extend an earlier call's messages plus the reply it got (the usual agent
loop) continues that call's *chain*: the chain's ids (prompt, sampled ids, observations) are kept
verbatim and only the new messages are rendered by the chat template, with the conversation
buffer the agent loop uses (orchestrator/llm/conversation.py). Any other call (the harness
dropped or rewrote earlier messages, changed its tools, or repeats a request) starts a new chain
rendered from its messages. Generation goes through the job's LLMSession: sticky backend,
counted by the router, policy version recorded per call.

Pure of HTTP: the server (server.py) turns each API's requests into `ChatRequest`s (chat_form.py)
and calls `complete`.

`max_calls` is counted at admission (admission.CallSlots): a call takes a slot before anything
else, spends it once it is sent to the backend, and gives it back if it is refused or fails
before that; concurrent calls beyond the limit get the refusal a sequential one gets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator.agent.calls import ParsedReply
from orchestrator.agent.messages import reply_text
from orchestrator.agent.parsers import Parser
from orchestrator.config import DEFAULTS
from orchestrator.errors import HpcRolloutError
from orchestrator.llm.conversation import Conversation
from orchestrator.proxy.admission import CallSlot, CallSlots
from orchestrator.proxy.chat_form import ChatRequest, Reply, message_key, reply_message
from orchestrator.agent.json_depth import MAX_NESTING, nests_within

RENDER_WINDOW = 2   # as the agent loop: deltas rendered after the last 2 messages (checked by Conversation)
# Rendering and tokenizing more new text than this runs in a thread, off the worker's event loop
# (other jobs' stages and proxies keep running); below it the thread hop costs more than it saves.
OFF_LOOP_CHARS = 32_000
DEEP_CALL = f"a tool call's arguments nest deeper than {MAX_NESTING} levels"


class LimitReached(HpcRolloutError):
    """The job's turn or context limit: the call is refused and the harness should stop."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason            # a StopReason value: max_turns | context_full


class BackendGone(HpcRolloutError):
    """The job's backend failed for good (the session waited and switched as long as it may)."""


class ClientGone(HpcRolloutError):
    """The harness closed the connection before its answer: the call is recorded as cancelled."""


@dataclass(frozen=True)
class ProxyLimits:
    max_calls: int = 30
    max_context_tokens: int = 16384
    max_tokens_per_call: int = 1024
    # New text beyond what the context's room could hold at this many characters per token is
    # refused before it is tokenized (run.toml [proxy] max_chars_per_token).
    max_chars_per_token: float = DEFAULTS.proxy.max_chars_per_token


@dataclass
class Chain:
    conversation: Conversation
    keys: list[tuple[Any, ...]]     # message_key of every message, the last reply included
    tools_key: str
    busy: bool = False              # a call on it is in flight: a concurrent call forks


@dataclass
class CallRecorder:
    llm: Any                                    # async generate(prompt_ids, sampling) -> Turn
    tokenizer: Any
    parse: Parser
    sampling: dict[str, Any] = field(default_factory=dict)   # the job's: they win over the harness's
    limits: ProxyLimits = field(default_factory=ProxyLimits)
    on_call: Callable[[dict[str, Any]], None] = lambda record: None
    calls: list[dict[str, Any]] = field(default_factory=list)   # Turn JSON + chain, extended, proxy_ms
    chains: list[Chain] = field(default_factory=list)
    malformed_calls: int = 0
    refused: int = 0
    stop_reason: str | None = None               # set when a limit was reached
    failure: str | None = None                   # the backend failed for good: what it said
    failed_with: Exception | None = None         # ... and the error itself (the job ends with it)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    unserved: list[str] = field(default_factory=list)   # endpoints the harness asked for that are not served
    slots: CallSlots = field(init=False)      # max_calls, taken as calls are admitted (admission.py)

    def __post_init__(self) -> None:
        self.slots = CallSlots(self.limits.max_calls)

    def _find_chain(self, request: ChatRequest) -> tuple[int, Chain] | None:
        for index in range(len(self.chains) - 1, -1, -1):
            chain = self.chains[index]
            size = len(chain.keys)
            if (not chain.busy and chain.tools_key == request.tools_key and len(request.keys) > size
                    and list(request.keys[:size]) == chain.keys):
                return index, chain
        return None

    def _stop(self, reason: str, message: str) -> LimitReached:
        self.refused += 1
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stopped.set()
        return LimitReached(reason, message)

    def note_unserved(self, endpoint: str) -> None:
        if endpoint not in self.unserved and len(self.unserved) < 32:
            self.unserved.append(endpoint)

    def _budget(self, request: ChatRequest, new_messages: Sequence[dict[str, Any]], prompt_tokens: int,
                counting: bool = False) -> int:
        """Characters of new text to render; refused when the context's room could not hold them
        (a call is refused and stops the harness; a count of tokens is only refused)."""
        chars = sum(len(str(m.get("content") or "")) + sum(len(c["function"]["arguments"]) + len(c["function"]["name"])
                                                           for c in m.get("tool_calls") or ())
                    for m in new_messages)
        if prompt_tokens == 0:
            chars += len(request.tools_key)
        room = self.limits.max_context_tokens - prompt_tokens
        if chars > room * self.limits.max_chars_per_token:
            message = (f"prompt is too long: the new messages hold {chars} characters, more than the {room} tokens "
                       f"left of this job's max_context_tokens ({self.limits.max_context_tokens}) can hold at "
                       f"{self.limits.max_chars_per_token:g} characters per token; not tokenized")
            raise LimitReached("context_full", message) if counting else self._stop("context_full", message)
        return chars

    async def complete(self, request: ChatRequest, client_gone: Callable[[], bool] = lambda: False) -> Reply:
        """One call: ids from the messages, one generation, the reply. `client_gone()` says whether
        the harness has left meanwhile: its call is then recorded as cancelled and extends nothing."""
        began = time.perf_counter()
        if self.failed_with is not None:   # no backend left: a harness's retries get the same answer at once
            raise BackendGone(self.failure or "")
        # Taken before any wait: calls in flight count, so concurrent calls cannot pass the limit together.
        slot = self.slots.take()
        if slot is None:
            raise self._stop("max_turns", f"this job allows {self.limits.max_calls} model calls; the limit is reached")
        try:
            return await self._complete(request, client_gone, slot, began)
        finally:
            slot.close()   # given back unless the call reached the backend

    async def _complete(self, request: ChatRequest, client_gone: Callable[[], bool], slot: CallSlot,
                        began: float) -> Reply:
        found = self._find_chain(request)
        diverged = None if found is not None else self._divergence(request)
        new_messages = list(request.messages)
        chain_index = -1   # known once appended: calls in flight may start chains too
        if found is not None:
            chain_index, chain = found
            new_messages = new_messages[len(chain.keys):]
            conversation = chain.conversation
            # input_ids is a fresh list each time it is read: its length from its parts.
            chars = self._budget(request, new_messages, len(conversation.prompt_ids) + len(conversation.response_ids))
            chain.busy = True   # before any wait: a concurrent call on this chain forks instead
            try:
                if chars > OFF_LOOP_CHARS:
                    delta = await asyncio.to_thread(chain.conversation.render_new, new_messages)
                else:
                    delta = chain.conversation.render_new(new_messages)
            except BaseException:
                chain.busy = False
                raise
            # One copy of the chain's ids (input_ids is a fresh list already): long prompts are
            # thousands of ids, each copy tens of microseconds on the worker's event loop.
            prompt = chain.conversation.input_ids
            prompt += delta
        else:
            delta = []
            chars = self._budget(request, new_messages, 0)

            def start() -> Conversation:
                return Conversation(self.tokenizer, new_messages, tools=request.tools, window=RENDER_WINDOW)

            conversation = await asyncio.to_thread(start) if chars > OFF_LOOP_CHARS else start()
            chain = Chain(conversation, [], request.tools_key, busy=True)
            prompt = chain.conversation.input_ids
        try:
            return await self._generate(request, chain, chain_index, found is not None, new_messages, delta, prompt,
                                        diverged, began, client_gone, slot)
        finally:
            chain.busy = False

    async def _generate(self, request: ChatRequest, chain: Chain, chain_index: int, extends: bool,
                        new_messages: list[dict[str, Any]], delta: list[int], prompt: list[int],
                        diverged: str | None, began: float, client_gone: Callable[[], bool], slot: CallSlot) -> Reply:
        room = self.limits.max_context_tokens - len(prompt)
        if room <= 0:
            raise self._stop("context_full", f"prompt is too long: {len(prompt)} tokens > {self.limits.max_context_tokens} "
                                             "maximum (this job's max_context_tokens)")
        wanted = [self.limits.max_tokens_per_call, room]
        wanted += [int(v) for v in (request.max_tokens, self.sampling.get("max_tokens")) if v is not None]
        sampling = {**request.sampling, **self.sampling, "max_tokens": min(wanted)}
        rendered_ms = (time.perf_counter() - began) * 1000
        slot.spend()
        try:
            turn = await self.llm.generate(prompt, sampling)
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            self.failed_with = exc
            self.stopped.set()
            raise BackendGone(self.failure) from exc
        after = time.perf_counter()
        # The turn's own lists (it is not kept): no second copy of the prompt per call.
        base = {**turn.to_json(copy=False), "api": request.api, "messages": len(request.messages), "diverged": diverged}
        if client_gone():
            # Sampled but never seen: kept in the row (turns) for the record, left out of samples,
            # and the chain stays as it was, so the harness's retry continues it.
            record = {**base, "chain": chain_index, "extended": extends, "cancelled": True,
                      "proxy_ms": round(rendered_ms, 3)}
            self.calls.append(record)
            self.on_call(record)
            raise ClientGone("the harness closed the connection before its answer")
        text = reply_text(self.tokenizer, turn.output_ids, turn.finish_reason)
        parsed = self._read_calls(text) if request.parse_tools else None
        if parsed is not None and parsed.errors:
            self.malformed_calls += len(parsed.errors)
        message = reply_message(parsed, text, f"{request.call_id_prefix}{len(self.calls)}")
        described = {**message, "content": message.get("content") or ""}
        conversation = chain.conversation
        if extends:
            conversation.append_rendered(new_messages, delta)
        else:
            self.chains.append(chain)
            chain_index = len(self.chains) - 1
        # Later templating sees the reply with its parsed tool calls; its ids are kept as sampled.
        conversation.add_assistant(turn.output_ids, turn.logprobs, turn.finish_reason, described)
        chain.keys = [*request.keys, message_key(described)]
        record = {**base, "chain": chain_index, "extended": extends,
                  "proxy_ms": round(rendered_ms + (time.perf_counter() - after) * 1000, 3)}
        self.calls.append(record)
        self.on_call(record)
        return Reply(message, turn.finish_reason, len(prompt), len(turn.output_ids))

    def _read_calls(self, text: str) -> ParsedReply:
        """The reply's tool calls. One nested past MAX_NESTING, or beyond what Python's json reads,
        is malformed: the harness gets the text (no answer could carry it)."""
        try:
            parsed = self.parse(text)
        except RecursionError:
            return ParsedReply(text, errors=(DEEP_CALL,))
        if not all(nests_within(call.arguments, MAX_NESTING) for call in parsed.calls):
            return ParsedReply(text, errors=(DEEP_CALL,))
        return parsed

    async def count_tokens(self, request: ChatRequest) -> int:
        """The prompt's tokens as a call with these messages and tools would send them (not a call)."""
        self._budget(request, request.messages, 0, counting=True)

        def count() -> int:
            return len(Conversation(self.tokenizer, list(request.messages), tools=request.tools).input_ids)

        chars = sum(len(str(m.get("content") or "")) for m in request.messages) + len(request.tools_key)
        return await asyncio.to_thread(count) if chars > OFF_LOOP_CHARS else count()

    def _last_chain(self) -> Chain | None:
        """The chain of the last answered call (a cancelled call belongs to none)."""
        for call in reversed(self.calls):
            if not call.get("cancelled") and 0 <= call["chain"] < len(self.chains):
                return self.chains[call["chain"]]
        return None

    def _divergence(self, request: ChatRequest) -> str | None:
        """Why a call does not extend the last call's chain (`inspect` shows it); None for the first."""
        last = self._last_chain()
        if last is None:
            return None
        if last.tools_key != request.tools_key:
            return "the tools changed"
        for index, (old, new) in enumerate(zip(last.keys, request.keys)):
            if old != new:
                return f"message {index} ({old[0]}) differs: {str(old)[:200]} != {str(new)[:200]}"
        return f"the request has {len(request.keys)} messages, the last call's chain {len(last.keys)}"

    def final_text(self) -> str:
        """The text of the last reply (what a math task grades when no answer was submitted)."""
        last = self._last_chain()
        if last is None:
            return ""
        for message in reversed(last.conversation.messages):
            if message.get("role") == "assistant":
                return str(message.get("content") or "")
        return ""
