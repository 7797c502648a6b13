"""Context management for long episodes: old turns make room instead of ending the episode.

A task (or handler) sets a policy, e.g. {"context": {"mode": "drop", "budget_tokens": 3000,
"keep_turns": 4}}. When the next request (the conversation so far plus the next reply's token
budget) would pass `budget_tokens`, the loop starts a new context from:

    the first messages (system prompt and task)      kept as they are
    older turns                                      drop: each observation replaced by a one-line
                                                     note (the actions stay); when that is not
                                                     enough, whole turns from the oldest, with a note
                                                     summarize: the policy is asked for a summary of
                                                     its work (a turn of its own, trained on like any
                                                     other) which replaces them
    the last `keep_turns` turns                      kept as they are

With `summarize_tool`, the model also gets a `summarize` tool: calling it replaces the turns
before the last `keep_turns` with the summary it wrote, when it chooses.

The new context is rendered by the chat template (earlier replies become context, not sampled
tokens) and sent as the next request; every request's exact input ids are in the row's `turns`,
so training sees exactly what the model saw. The row's main sequence is the last context; each
context is a training sample of its own (`result.samples`, rebuilt by
orchestrator.proxy.trajectory.samples_of or trainer/segments.py).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from orchestrator.settings_spec import Family, checked, setting

if TYPE_CHECKING:
    from orchestrator.llm.conversation import Conversation

SUMMARY_REQUEST = ("Your context is nearly full. Summarize your work so far: what you found, what you "
                   "changed, and what is left to do. Your earlier turns will be replaced by this summary.")
SUMMARY_HEADER = "Summary of your earlier work:\n"
SUMMARY_RESERVE = 128   # tokens kept free under the window for the summary request and an observation


class ContextMode(str, enum.Enum):
    NONE = "none"            # a full context ends the episode (stop reason context_full)
    DROP = "drop"            # old observations (then old turns) replaced by short notes
    SUMMARIZE = "summarize"  # old turns replaced by a summary the policy writes


CONTEXT = Family("context setting", "context {key}", show_help=True)


@dataclass(frozen=True)
class ContextPolicy:
    mode: ContextMode = setting(ContextMode.NONE, "what happens once the context passes its budget")
    budget_tokens: int = setting(
        0, "compact when the next request would pass this many tokens (0: max_context_tokens)", bounds=(0, 10_000_000))
    keep_turns: int = setting(4, "the most recent turns always kept as they are", bounds=(0, 1000))
    summary_tokens: int = setting(256, "summarize: the summary's token budget", bounds=(8, 100_000))
    summarize_tool: bool = setting(False, "offer the model the `summarize` tool")

    @property
    def active(self) -> bool:
        return self.mode is not ContextMode.NONE or self.summarize_tool

    def budget(self, max_context_tokens: int) -> int:
        """The token count past which the context is compacted. summarize keeps room below the
        window for the summary exchange (the request and the summary); one that does not fit drops."""
        budget = min(self.budget_tokens or max_context_tokens, max_context_tokens)
        if self.mode is ContextMode.SUMMARIZE:
            budget = min(budget, max_context_tokens - self.summary_tokens - SUMMARY_RESERVE)
        return budget

    @classmethod
    def parse(cls, base: "ContextPolicy", overrides: Any) -> "ContextPolicy":
        """`base` with a task's "context" object, each key checked."""
        if overrides is None:
            return base
        if not isinstance(overrides, dict):
            raise ValueError(f"context must be an object such as {{\"mode\": \"drop\", \"keep_turns\": 4}}, "
                             f"got {overrides!r}")
        return replace(base, **checked(cls, overrides, CONTEXT))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "mode": self.mode.value}


def split_turns(messages: list[dict[str, Any]], first: int) -> list[list[dict[str, Any]]]:
    """The messages after the first `first`, one list per turn: an assistant reply and what followed it."""
    turns: list[list[dict[str, Any]]] = []
    for message in messages[first:]:
        if message.get("role") == "assistant" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def dropped_note(message: dict[str, Any]) -> dict[str, Any]:
    """An observation replaced by a note of what it was (its role and call id stay)."""
    size = len(str(message.get("content") or ""))
    return {**message, "content": f"[output dropped to save context: {size} characters]"}


def dropped(head: list[dict[str, Any]], turns: list[list[dict[str, Any]]], keep: int,
            gone: int) -> list[dict[str, Any]]:
    """The first messages, then the turns before the last `keep` with their observations noted and
    the oldest `gone` of them left out (one note says how many), then the last `keep` turns."""
    old, kept = turns[:len(turns) - keep], turns[len(turns) - keep:]
    noted = [[m if m.get("role") == "assistant" else dropped_note(m) for m in turn] for turn in old[gone:]]
    note = [{"role": "user", "content": f"[{gone} earlier turn(s) dropped to save context]"}] if gone else []
    return head + note + [m for turn in noted + kept for m in turn]


def summarized(head: list[dict[str, Any]], turns: list[list[dict[str, Any]]], keep_turns: int,
               summary: str) -> list[dict[str, Any]]:
    """The first messages, the summary in place of the turns before the last `keep_turns`, then those."""
    keep = min(keep_turns, len(turns))
    replaced = len(turns) - keep
    note = {"role": "user", "content": SUMMARY_HEADER + summary.strip()}
    return head + [note] + [m for turn in turns[replaced:] for m in turn]


def fresh_conversation(old: "Conversation", messages: list[dict[str, Any]]) -> "Conversation":
    """A new context from `messages`, rendered by the template with its tools, ready for a reply."""
    from orchestrator.llm.conversation import Conversation

    return Conversation(old.tokenizer, messages, tools=old.tools, window=old.window)
