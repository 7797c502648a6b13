"""The token buffer of one conversation: ids are appended, never re-tokenized.

Re-rendering a history from decoded text changes ids (byte-level BPE merges differently,
templates re-space tool calls), which silently corrupts the policy gradient. So:
  * the first prompt is rendered with the chat template once;
  * each assistant turn appends exactly the sampled ids (mask 1, logprobs from the server);
  * new messages (user, tool) are rendered as a text *delta* of the template and appended
    (mask 0, logprob 0.0), together with whatever the template closes an assistant turn with
    that the model did not sample itself (e.g. "\\n" after <|im_end|>, or all of it when the
    reply was cut by max_tokens).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import HpcRolloutError
from orchestrator.llm.observation_pieces import ObservationPieces
from orchestrator.llm.prompt_cache import FIRST_PROMPTS

SENTINEL = "\u2063HPC_ROLLOUT_SENTINEL\u2063"
VERIFY_EVERY = 32


class ChatTemplateError(HpcRolloutError, ValueError):
    """The chat template cannot be extended by a delta (it rewrites earlier turns)."""


@dataclass
class Conversation:
    tokenizer: Any
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)   # 1 sampled, 0 observation/template
    logprobs: list[float] = field(default_factory=list)      # aligned with response_ids; 0.0 where mask 0
    # Render the delta of new messages against only the leading system messages and the last
    # `window` messages (None: the whole history). Rendering cost grows with the history, which
    # an agent's 30-turn episode feels; the windowed delta is compared with the full one on the
    # first renders and every VERIFY_EVERY-th after, and a difference turns windowing off for
    # good (window_misses counts them), so the ids stay exactly the template's.
    window: int | None = None
    window_misses: int = 0
    # Windowed renders also reuse the template's text around message contents and its special
    # tokens' ids (observation_pieces.py), checked on the same schedule; a difference turns that
    # off for good (pieces_misses counts it).
    pieces_misses: int = 0
    _last_stop_text: str | None = None
    _renders: int = 0
    _compiled: Any = None          # the compiled template of the windowed path; False: not usable
    _pieces: ObservationPieces | None = None

    def __post_init__(self) -> None:
        self.messages = [dict(m) for m in self.messages]
        if not self.prompt_ids:   # the samples of a group share their first prompt: rendered once
            self.prompt_ids = FIRST_PROMPTS.ids(self.tokenizer, self.messages, self.tools, lambda: self.encode(
                self.render(self.messages, generation_prompt=True)))

    @property
    def input_ids(self) -> list[int]:
        """What the next generation request sends: the whole conversation so far."""
        return self.prompt_ids + self.response_ids

    def render(self, messages: Sequence[dict[str, Any]], *, generation_prompt: bool, with_tools: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tools=self.tools if with_tools else None, tokenize=False,
            add_generation_prompt=generation_prompt,
        )

    def _render_fast(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> str:
        """The template compiled once and rendered directly (apply_chat_template spends most of
        its time copying the inputs); checked against apply_chat_template on its first use."""
        if self._compiled is None:
            self._compiled = _compile(self.tokenizer)
            if self._compiled:
                probe = self.messages[-4:]
                if self._call_compiled(probe, True) != self.render(probe, generation_prompt=True, with_tools=False):
                    self._compiled = False
        if not self._compiled:
            return self.render(messages, generation_prompt=generation_prompt, with_tools=False)
        return self._call_compiled(messages, generation_prompt)

    def _call_compiled(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        assert self._compiled
        clean = [{k: v for k, v in m.items() if v is not None} for m in messages]
        return self._compiled.render(messages=clean, tools=None, documents=None,
                                     add_generation_prompt=generation_prompt, **self.tokenizer.special_tokens_map)

    def encode(self, text: str) -> list[int]:
        rust = _plain_rust_tokenizer(self.tokenizer)
        if rust is not None:
            # The same ids without transformers' wrapping (~25% less per delta), and one text alone:
            # a batch goes through the thread pool, whose wake-ups cost milliseconds on a busy node.
            return list(rust.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def add_assistant(self, output_ids: Sequence[int], logprobs: Sequence[float], finish_reason: str,
                      message: dict[str, Any] | None = None) -> str:
        """Append sampled ids verbatim; returns the reply text (kept for templating only).
        `message`: the reply as later templating should see it (e.g. with the tool calls a parser
        found), when the caller has it already; the ids are then not decoded again."""
        if len(output_ids) != len(logprobs):
            raise ValueError(f"{len(output_ids)} output ids but {len(logprobs)} logprobs")
        self.response_ids.extend(int(i) for i in output_ids)
        self.response_mask.extend([1] * len(output_ids))
        self.logprobs.extend(float(x) for x in logprobs)
        stop_id = output_ids[-1] if output_ids and finish_reason == "stop" else None
        self._last_stop_text = _token_text(self.tokenizer, int(stop_id)) if stop_id is not None else None
        if message is not None:
            self.messages.append({**message, "role": "assistant"})
            return str(message.get("content") or "")
        text = self.tokenizer.decode(list(output_ids), skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def describe_last_assistant(self, message: dict[str, Any]) -> None:
        """Replace the last assistant message (templating only, its ids stay as sampled), e.g.
        with the `tool_calls` a parser found, so later templating sees a structured history."""
        if not self.messages or self.messages[-1].get("role") != "assistant":
            raise ValueError("describe_last_assistant follows add_assistant")
        self.messages[-1] = {**dict(message), "role": "assistant"}

    def add_messages(self, new: Sequence[dict[str, Any]]) -> list[int]:
        """Append new user/tool messages as observation tokens; returns the appended ids."""
        return self.append_rendered(new, self.render_new(new))

    def render_new(self, new: Sequence[dict[str, Any]]) -> list[int]:
        """The observation ids `new` messages would append, without appending them."""
        if not self.messages or self.messages[-1].get("role") != "assistant":
            raise ValueError("add_messages follows an assistant turn; call add_assistant first")
        self._renders += 1
        if self.window is not None and self.window_misses == 0:
            # The tool declarations sit in the prompt's system part; the delta of later messages
            # rarely depends on them, and the check below catches a template where it does.
            history = self._windowed_history()

            def windowed_text(messages: list[dict[str, Any]]) -> str:
                return self._observation_text(messages, history, with_tools=False)

            pieces = None
            if self.pieces_misses == 0:
                if self._pieces is None:
                    self._pieces = ObservationPieces(self.tokenizer, self.encode)
                pieces = self._pieces.ids(new, windowed_text, self._last_stop_text)
            if self._renders <= 2 or self._renders % VERIFY_EVERY == 0:
                full = self._observation_text(list(new), self.messages[:-1])
                if windowed_text(list(new)) != full:
                    self.window_misses += 1
                    return self.encode(full)
                ids = self.encode(full)
                if pieces is not None and pieces != ids:
                    self.pieces_misses += 1
                return ids
            return pieces if pieces is not None else self.encode(windowed_text(list(new)))
        return self.encode(self._observation_text(list(new), self.messages[:-1]))

    def _windowed_history(self) -> list[dict[str, Any]]:
        earlier = self.messages[:-1]
        lead = 0
        while lead < len(earlier) and earlier[lead].get("role") == "system":
            lead += 1
        tail_start = max(lead, len(earlier) - int(self.window or 0))
        return earlier[:lead] + earlier[tail_start:]

    def _observation_text(self, new: list[dict[str, Any]], earlier: list[dict[str, Any]], with_tools: bool = True) -> str:
        """Closing text of the last assistant turn + the template delta of `new`, rendered after
        `earlier` messages and a stand-in for the assistant turn (its ids are kept as sampled)."""
        history = earlier + [{"role": "assistant", "content": SENTINEL}]
        if with_tools:
            before = self.render(history, generation_prompt=False)
            after = self.render(history + new, generation_prompt=True)
        else:
            before = self._render_fast(history, generation_prompt=False)
            after = self._render_fast(history + new, generation_prompt=True)
        suffix = before[before.rindex(SENTINEL) + len(SENTINEL):]
        stop = self._last_stop_text
        closing = suffix[len(stop):] if stop and suffix.startswith(stop) else suffix
        if after.startswith(before):
            return closing + after[len(before):]
        return closing + self.delta_text(new)

    def append_rendered(self, new: Sequence[dict[str, Any]], ids: Sequence[int]) -> list[int]:
        """Append `new` messages with the ids `render_new(new)` gave for them."""
        ids = [int(i) for i in ids]
        self.messages.extend(dict(m) for m in new)
        self.response_ids.extend(ids)
        self.response_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        return ids

    def delta_text(self, new: list[dict[str, Any]]) -> str:
        """Template text of `new` messages (+ generation prompt) as the template appends it."""
        history = self.messages[:-1] + [{"role": "assistant", "content": SENTINEL}]
        before = self.render(history, generation_prompt=False)
        after = self.render(history + new, generation_prompt=True)
        if after.startswith(before):
            return after[len(before):]
        # Templates that rewrite earlier turns: render the new messages after a stub turn.
        stub = [{"role": "user", "content": SENTINEL}]
        before = self.render(stub, generation_prompt=False)
        after = self.render(stub + new, generation_prompt=True)
        if not after.startswith(before):
            raise ChatTemplateError(
                "the chat template renders earlier messages differently once new ones are added, "
                "so a delta cannot be computed; use a template that appends turns"
            )
        return after[len(before):]

    def to_json(self) -> dict[str, Any]:
        return {"prompt_ids": self.prompt_ids, "response_ids": self.response_ids,
                "response_mask": self.response_mask, "logprobs": self.logprobs}


# The text of one token id (a reply's stop token) per tokenizer: the wrapper's decode costs ~20 us.
_TOKEN_TEXTS: "weakref.WeakKeyDictionary[Any, dict[int, str]]" = weakref.WeakKeyDictionary()


def _token_text(tokenizer: Any, token_id: int) -> str:
    try:
        texts = _TOKEN_TEXTS.setdefault(tokenizer, {})
    except TypeError:   # an object that takes no weak reference
        return str(tokenizer.decode([token_id]))
    text = texts.get(token_id)
    if text is None:
        text = texts[token_id] = str(tokenizer.decode([token_id]))
    return text


def _plain_rust_tokenizer(tokenizer: Any) -> Any:
    """The `tokenizers` object behind a fast transformers tokenizer when calling it directly gives
    what `tokenizer.encode` gives (no truncation or padding configured on it), else None."""
    rust = getattr(tokenizer, "_tokenizer", None)
    if (rust is None or not hasattr(rust, "encode")
            or getattr(rust, "truncation", None) is not None or getattr(rust, "padding", None) is not None):
        return None
    return rust


def _compile(tokenizer: Any) -> Any:
    """transformers' own compiled template (same environment and filters), or False."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return False
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # another transformers version: the public path stays
        return False
    try:
        return _compile_jinja_template(template)
    except Exception:
        return False
