"""One job's calls: messages in, token ids to the backend, an OpenAI reply out, all recorded.

A call whose messages extend an earlier call's messages plus the reply it got (the usual agent
loop) continues that call's *chain*: the chain's ids (prompt, sampled ids, observations) are kept
verbatim and only the new messages are rendered by the chat template, with the conversation
buffer the agent loop uses (orchestrator/llm/conversation.py). Any other call (the harness
dropped or rewrote earlier messages, changed its tools, or repeats a request) starts a new chain
rendered from its messages. Generation goes through the job's LLMSession: sticky backend,
counted by the router, policy version recorded per call.

Pure of HTTP: the server (server.py) turns requests into `ChatRequest`s and calls `complete`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator.agent.messages import reply_text
from orchestrator.agent.parsers import Parser
from orchestrator.errors import HpcRolloutError
from orchestrator.llm.conversation import Conversation
from orchestrator.proxy.wire import ChatRequest, message_key, reply_message, template_message

RENDER_WINDOW = 2   # as the agent loop: deltas rendered after the last 2 messages (checked by Conversation)


class LimitReached(HpcRolloutError):
    """The job's turn or context limit: the call is refused and the harness should stop."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason            # a StopReason value: max_turns | context_full


class BackendGone(HpcRolloutError):
    """The job's backend failed for good (the session waited and switched as long as it may)."""


@dataclass(frozen=True)
class ProxyLimits:
    max_calls: int = 30
    max_context_tokens: int = 16384
    max_tokens_per_call: int = 1024


@dataclass
class Chain:
    conversation: Conversation
    keys: list[tuple[Any, ...]]     # message_key of every message, the last reply included
    tools_key: str
    busy: bool = False              # a call on it is in flight: a concurrent call forks


@dataclass(frozen=True)
class Reply:
    message: dict[str, Any]
    finish_reason: str              # the backend's: stop | length
    prompt_tokens: int
    completion_tokens: int


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

    async def complete(self, request: ChatRequest) -> Reply:
        began = time.perf_counter()
        if self.failed_with is not None:   # no backend left: a harness's retries get the same answer at once
            raise BackendGone(self.failure or "")
        if len(self.calls) >= self.limits.max_calls:
            raise self._stop("max_turns", f"this job allows {self.limits.max_calls} model calls; the limit is reached")
        found = self._find_chain(request)
        diverged = None if found is not None else self._divergence(request)
        new_messages = list(request.messages)
        if found is not None:
            chain_index, chain = found
            new_messages = new_messages[len(chain.keys):]
            delta = chain.conversation.render_new(new_messages)
            prompt = chain.conversation.input_ids + delta
        else:
            chain_index, delta = -1, []   # known once appended: calls in flight may start chains too
            chain = Chain(Conversation(self.tokenizer, new_messages, tools=request.tools, window=RENDER_WINDOW),
                          [], request.tools_key)
            prompt = chain.conversation.input_ids
        room = self.limits.max_context_tokens - len(prompt)
        if room <= 0:
            raise self._stop("context_full", f"the conversation has {len(prompt)} tokens; this job allows "
                                             f"{self.limits.max_context_tokens} (max_context_tokens)")
        wanted = [self.limits.max_tokens_per_call, room]
        wanted += [int(v) for v in (request.max_tokens, self.sampling.get("max_tokens")) if v is not None]
        sampling = {**request.sampling, **self.sampling, "max_tokens": min(wanted)}
        chain.busy = True
        rendered_ms = (time.perf_counter() - began) * 1000
        try:
            turn = await self.llm.generate(prompt, sampling)
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            self.failed_with = exc
            self.stopped.set()
            raise BackendGone(self.failure) from exc
        finally:
            chain.busy = False
        after = time.perf_counter()
        conversation = chain.conversation
        if found is not None:
            conversation.append_rendered(new_messages, delta)
        else:
            self.chains.append(chain)
            chain_index = len(self.chains) - 1
        conversation.add_assistant(turn.output_ids, turn.logprobs, turn.finish_reason)
        text = reply_text(self.tokenizer, turn.output_ids, turn.finish_reason)
        parsed = self.parse(text) if request.parse_tools else None
        if parsed is not None and parsed.errors:
            self.malformed_calls += len(parsed.errors)
        message = reply_message(parsed, text, f"call_{len(self.calls)}")
        described = template_message(message)
        conversation.describe_last_assistant(described)
        chain.keys = [*request.keys, message_key(described)]
        record = {**turn.to_json(), "chain": chain_index, "extended": found is not None,
                  "messages": len(request.messages), "diverged": diverged,
                  "proxy_ms": round(rendered_ms + (time.perf_counter() - after) * 1000, 3)}
        self.calls.append(record)
        self.on_call(record)
        return Reply(message, turn.finish_reason, len(prompt), len(turn.output_ids))

    def _divergence(self, request: ChatRequest) -> str | None:
        """Why a call does not extend the last call's chain (`inspect` shows it); None for the first."""
        if not self.calls:
            return None
        last = self.chains[self.calls[-1]["chain"]]
        if last.tools_key != request.tools_key:
            return "the tools changed"
        for index, (old, new) in enumerate(zip(last.keys, request.keys)):
            if old != new:
                return f"message {index} ({old[0]}) differs: {str(old)[:200]} != {str(new)[:200]}"
        return f"the request has {len(request.keys)} messages, the last call's chain {len(last.keys)}"

    def final_text(self) -> str:
        """The text of the last reply (what a math task grades when no answer was submitted)."""
        if not self.chains:
            return ""
        last = self.calls[-1]["chain"] if self.calls else -1
        for message in reversed(self.chains[last].conversation.messages):
            if message.get("role") == "assistant":
                return str(message.get("content") or "")
        return ""
