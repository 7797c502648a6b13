"""Scripted completions: a policy that answers with predetermined text, for tests and demos.

`serve-llm --scripted FILE --tiny` (or `--model DIR`) serves them over the same protocol as
the model: each reply's text is rendered to token ids by the real tokenizer, the stop token
is appended, and ids come back with logprobs (0.0: a scripted policy picks every token with
probability 1), so a client cannot tell it from a sampling server.

FILE is JSON (a list) or JSON Lines of scripts:
    {"match": "What is 17 * 23?", "replies": ["<tool_call>...</tool_call>", "\\\\boxed{391}"]}
A request is answered by the script whose `match` occurs in the decoded prompt (the longest
match wins; "" matches everything), with reply number N for the N-th assistant turn (counted
from the template's generation prompt in the prompt). Past the last reply: `after` (default "").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.devserver.sampling import GenRequest, GenResult
from orchestrator.errors import HpcRolloutError


class ScriptError(HpcRolloutError, ValueError):
    """A scripts file that cannot be used, or a prompt no script matches."""


@dataclass(frozen=True)
class Script:
    match: str
    replies: tuple[str, ...]
    after: str = ""

    def reply(self, turn: int) -> str:
        return self.replies[turn] if turn < len(self.replies) else self.after


def load_scripts(path: Path) -> list[Script]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScriptError(f"scripts file {path}: {exc}") from None
    try:
        data = json.loads(text)
        entries = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        try:
            entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ScriptError(f"scripts file {path} is neither JSON nor JSON Lines: {exc}") from None
    scripts = []
    for index, entry in enumerate(entries):
        replies = entry.get("replies") if isinstance(entry, dict) else None
        if not isinstance(replies, list) or not all(isinstance(r, str) for r in replies) \
                or not isinstance(entry.get("match", ""), str):
            raise ScriptError(f"scripts file {path}, script {index}: expected "
                              '{"match": "text in the prompt", "replies": ["...", ...], "after": "..."}')
        scripts.append(Script(entry.get("match", ""), tuple(replies), str(entry.get("after", ""))))
    if not scripts:
        raise ScriptError(f"scripts file {path} holds no scripts")
    return scripts


def generation_prompt(tokenizer: Any) -> str:
    """The text the chat template adds to open an assistant turn (e.g. '<|im_start|>assistant\\n')."""
    probe = [{"role": "user", "content": "x"}]
    bare = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
    opened = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    if not opened.startswith(bare) or opened == bare:
        raise ScriptError("the chat template has no generation prompt to count assistant turns by")
    return opened[len(bare):]


class ScriptedEngine:
    """The Engine interface (`async submit(GenRequest) -> GenResult`) without a model."""

    def __init__(self, tokenizer: Any, scripts: list[Script]) -> None:
        self.tokenizer = tokenizer
        self.scripts = sorted(scripts, key=lambda s: len(s.match), reverse=True)
        self.opener = generation_prompt(tokenizer)
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ScriptError("the tokenizer has no eos token to end scripted replies with")
        self.eos_id = int(eos)

    def pick(self, prompt_ids: tuple[int, ...]) -> tuple[Script, int]:
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        for script in self.scripts:
            if script.match in text:
                return script, max(text.count(self.opener) - 1, 0)
        raise ScriptError(f"no script matches this prompt (its start: {text[:200]!r})")

    def abort_all(self) -> int:
        return 0   # every answer is immediate: nothing is ever in flight

    def abort(self, rid: str) -> bool:
        return False

    def in_flight(self) -> int:
        return 0

    async def submit(self, request: GenRequest, rid: str | None = None) -> GenResult:
        script, turn = self.pick(request.prompt_ids)
        ids = list(self.tokenizer.encode(script.reply(turn), add_special_tokens=False)) + [self.eos_id]
        finish = "stop"
        if len(ids) > request.max_tokens:
            ids, finish = ids[: request.max_tokens], "length"
        zeros = [0.0] * len(ids)
        return GenResult(output_ids=ids, raw_logprobs=zeros, processed_logprobs=list(zeros),
                         finish_reason=finish, matched_stop=self.eos_id if finish == "stop" else None)


def scripted_engine(path: Path, tokenizer: Any) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, load_scripts(path))
