"""First prompts rendered lately, kept per tokenizer: the samples of a group render once.

A trainer samples each prompt n times (GRPO groups), and a worker runs the samples of a group
together: each would render the same messages with the chat template and tokenize them again
(a Jinja render and a tokenizer pass per sample). The ids are kept by the exact messages and
tools (their JSON) and the tokenizer's chat template, so a changed template renders anew; a
tokenizer that is gone takes its prompts with it.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import orjson

PROMPTS_KEPT = 1024   # per tokenizer: a group's samples arrive together, so few are ever asked again

_Key = tuple[Any, bytes]


class FirstPrompts:
    """The ids of rendered first prompts, by tokenizer, the most recent PROMPTS_KEPT of each."""

    def __init__(self, kept: int = PROMPTS_KEPT) -> None:
        self.kept = kept
        self._by_tokenizer: weakref.WeakKeyDictionary[Any, OrderedDict[_Key, tuple[int, ...]]] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()   # the proxy renders from threads too

    def ids(self, tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
            render: Callable[[], list[int]]) -> list[int]:
        """The prompt ids of `messages` (and `tools`) under `tokenizer`: kept ones, or `render()`'s."""
        key = _key_of(tokenizer, messages, tools)
        if key is None:
            return render()
        with self._lock:
            try:
                kept = self._by_tokenizer.setdefault(tokenizer, OrderedDict())
            except TypeError:   # a tokenizer that takes no weak reference: not kept
                kept = None
            found = kept.get(key) if kept is not None else None
            if found is not None:
                kept.move_to_end(key)   # type: ignore[union-attr]
                return list(found)
        ids = render()
        if kept is not None:
            with self._lock:
                kept[key] = tuple(ids)
                while len(kept) > self.kept:
                    kept.popitem(last=False)
        return ids


def _key_of(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> _Key | None:
    """The template and the exact JSON of what is rendered; None when it is not JSON (not kept)."""
    template = getattr(tokenizer, "chat_template", None)
    try:
        if template is not None and not isinstance(template, str):
            template = orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
        return template, orjson.dumps([list(messages), tools])
    except TypeError:   # orjson.JSONEncodeError is a TypeError
        return None


FIRST_PROMPTS = FirstPrompts()
