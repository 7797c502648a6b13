"""Observation ids without rendering the chat template: its text around the contents, cached.

An agent's observations have the same shape turn after turn (tool messages after an assistant
turn), and the template wraps each content in the same text whatever the content says. The first render of a shape puts a
marker where each content goes and keeps the text around the markers; later observations join
those pieces with their real contents, and the template is not rendered again.

Token ids: HF tokenizers cut the input at special tokens before normalizing and pre-tokenizing,
so the text between two special tokens is tokenized on its own. The pieces' stretches from one
special token to another are therefore tokenized once, and per observation only the text from
the last special token before a content to the first one after it (usually a newline, the
content and a newline) is tokenized. Conversation compares the result with the full render on
its verification schedule and stops using the pieces at the first difference.

What this assumes: the template wraps a tool message's content the same way whatever it says.
A template that trims contents, or wraps the probe contents below differently, is detected when
a shape is first seen and rendered in full; one that branches on other contents is caught only
at the next verification, like the windowed history it builds on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Whitespace at both ends: a template that trims or rewrites contents does not show the marker
# verbatim, and such a shape is rendered in full every time instead.
MARKER = " \n\u2063HPC_ROLLOUT_CONTENT_{}\u2063\n "
# Contents a template might branch on (empty, an error, already wrapped, a reasoning end);
# a template that wraps any of them differently is rendered in full every time.
PROBES = ("", "  ", "Error: x", "<tool_response>\nx\n</tool_response>", "x</think>\n\ny")
Shape = tuple[tuple[str, tuple[str, ...]], ...]


CALL_IDS = ("tool_call_id", "id")
MAX_KEYS = 64   # shapes x keyed values kept per conversation (a template printing call ids adds one a turn)


@dataclass(frozen=True)
class Segment:
    """Cached ids (`fixed`), or text to tokenize: `texts` joined with the contents at `contents`."""
    fixed: tuple[int, ...] | None = None
    texts: tuple[str, ...] = ("",)
    contents: tuple[int, ...] = ()   # the content index before each of texts[1:]


class ObservationPieces:
    def __init__(self, tokenizer: Any, encode: Callable[[str], list[int]]) -> None:
        self.encode = encode
        self.boundaries = _special_token_pattern(tokenizer)
        self._keyed: dict[Shape, tuple[tuple[int, str], ...] | None] = {}
        self._segments: dict[tuple[Any, ...], list[Segment] | None] = {}
        self.hits = 0   # observations served from the pieces

    def ids(self, new: Sequence[dict[str, Any]], render: Callable[[list[dict[str, Any]]], str],
            closing_key: Any) -> list[int] | None:
        """The observation ids of `new`, or None when this shape cannot use cached pieces.

        `render(messages)` is the observation text of `messages` (closing text included), and
        `closing_key` what that closing text depends on (the stop text of the last reply)."""
        shape = _shape(new)
        if shape is None:
            return None
        if shape not in self._keyed:
            self._keyed[shape] = self._key_fields(new, render)
        keyed = self._keyed[shape]
        if keyed is None:
            return None
        key = (closing_key, shape, tuple(new[index][name] for index, name in keyed))
        if key not in self._segments:
            if len(self._segments) >= MAX_KEYS:
                self._segments.clear()
            self._segments[key] = self._split(new, render)
        segments = self._segments[key]
        if segments is None:
            return None
        ids: list[int] = []
        for segment in segments:
            if segment.fixed is not None:
                ids.extend(segment.fixed)
                continue
            text = segment.texts[0] + "".join(new[c]["content"] + t for c, t in zip(segment.contents, segment.texts[1:]))
            if text:
                ids.extend(self.encode(text))
        self.hits += 1
        return ids

    def _key_fields(self, new: Sequence[dict[str, Any]],
                        render: Callable[[list[dict[str, Any]]], str]) -> tuple[tuple[int, str], ...] | None:
        """The fields whose values key the pieces: all but content, and but a call id the
        template does not print (it changes every turn). A tool's name stays in the key even
        when not printed: a template may branch on it."""
        probe, fields = [], {}
        for index, message in enumerate(new):
            copy = dict(message)
            for name in message:
                if name not in ("role", "content"):
                    copy[name] = f"\u2063HPC_ROLLOUT_FIELD_{index}_{name}\u2063"
                    fields[copy[name]] = (index, name)
            copy["content"] = MARKER.format(index)
            probe.append(copy)
        try:
            text = render(probe)
        except Exception:  # a template that insists on a field's real form: render in full
            return None
        return tuple(place for marker, place in fields.items() if marker in text or place[1] not in CALL_IDS)

    def _split(self, new: Sequence[dict[str, Any]], render: Callable[[list[dict[str, Any]]], str]) -> list[Segment] | None:
        markers = [MARKER.format(index) for index in range(len(new))]
        try:
            text = render([{**message, "content": marker} for message, marker in zip(new, markers)])
        except Exception:
            return None
        pieces = re.split("(" + "|".join(re.escape(m) for m in markers) + ")", text)
        if pieces[1::2] != markers:   # each content exactly once, in order
            return None
        texts = pieces[0::2]
        for probe in PROBES:   # the text around a content must not depend on the content
            try:
                rendered = render([{**message, "content": probe} for message in new])
            except Exception:
                return None
            if rendered != probe.join(texts):
                return None
        return self._segments_of(texts)

    def _segments_of(self, texts: list[str]) -> list[Segment]:
        """Cut the pieces at their first and last special token: what lies between is fixed."""
        segments: list[Segment] = []
        live_texts: list[str] = [""]
        live_contents: list[int] = []
        for index, text in enumerate(texts):
            if index > 0:
                live_contents.append(index - 1)
                live_texts.append("")
            found = list(self.boundaries.finditer(text)) if self.boundaries is not None else []
            if not found:
                live_texts[-1] += text
                continue
            start, end = found[0].start(), found[-1].end()
            live_texts[-1] += text[:start]
            segments.append(Segment(texts=tuple(live_texts), contents=tuple(live_contents)))
            segments.append(Segment(fixed=tuple(self.encode(text[start:end]))))
            live_texts, live_contents = [text[end:]], []
        segments.append(Segment(texts=tuple(live_texts), contents=tuple(live_contents)))
        # Text without a content between special tokens (or the ends) is fixed too.
        return [Segment(fixed=tuple(self.encode(s.texts[0]))) if s.fixed is None and not s.contents else s
                for s in segments if s.fixed is not None or s.contents or s.texts[0]]


def _shape(new: Sequence[dict[str, Any]]) -> Shape | None:
    """Tool messages only: templates do inspect user contents (Qwen3 looks for <tool_response>
    in them to place the last query), which a marker in the content's place would hide."""
    shape = []
    for message in new:
        if message.get("role") != "tool" or not isinstance(message.get("content"), str):
            return None
        others = tuple(sorted(name for name in message if name not in ("role", "content")))
        if any(not isinstance(message[name], str) for name in others):
            return None   # structured fields (tool_calls): rendered in full
        shape.append((message["role"], others))
    return tuple(shape)


def _special_token_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """Special tokens that cut the input cleanly (no whitespace stripping around them)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    tokens = [str(t) for t in decoder.values()
              if getattr(t, "special", False) and not getattr(t, "lstrip", False)
              and not getattr(t, "rstrip", False) and not getattr(t, "single_word", False)]
    if not tokens or getattr(tokenizer, "split_special_tokens", False):
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))
