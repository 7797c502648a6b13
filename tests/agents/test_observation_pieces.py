"""Observation ids from cached template pieces equal the full render's, the template is not
rendered between verifications, and templates the pieces cannot serve fall back to rendering."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from orchestrator.agent.tools import openai_tools, tool_specs
from orchestrator.llm.conversation import Conversation
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.tokenizer import load_tokenizer

TOOLS = openai_tools(tool_specs(["bash", "finish"]))
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "true"}}\n</tool_call>'
# Outputs a tokenizer can split awkwardly: edge whitespace, special tokens' text, non-ASCII, nothing.
OUTPUTS = ["[exit code 0]", "  leading and trailing  \n\n", "<|im_end|>\n<tool_response>x</tool_response>",
           "caf\u00e9 \u00e9t\u00e9 \u2603\n\tdone", "", "\n", "a\r\nb", "x" * 3000]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(tiny_model_dir())


def play(tokenizer: Any, window: int | None, turns: int, calls_per_turn: int = 1,
         with_ids: bool = True) -> Conversation:
    conversation = Conversation(tokenizer, [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Run true."}], tools=TOOLS, window=window)
    sampled = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    for turn in range(turns):
        # Every other reply is cut by max_tokens (no stop token): the closing text differs.
        stop = turn % 2 == 0
        ids = sampled if stop else sampled[:-1]
        conversation.add_assistant(ids, [0.0] * len(ids), "stop" if stop else "length")
        new = [{"role": "tool", "name": "bash" if (turn + k) % 3 else "python", "content": OUTPUTS[(turn + k) % len(OUTPUTS)]}
               for k in range(calls_per_turn)]
        if with_ids:
            new = [{**m, "tool_call_id": f"call_{turn}_{k}"} for k, m in enumerate(new)]
        conversation.add_messages(new)
    return conversation


@pytest.mark.parametrize("calls_per_turn", [1, 3])
def test_cached_pieces_give_the_full_renders_ids(tokenizer: Any, calls_per_turn: int) -> None:
    fast, full = play(tokenizer, 2, 40, calls_per_turn), play(tokenizer, None, 40, calls_per_turn)
    assert fast.input_ids == full.input_ids
    assert fast.window_misses == 0 and fast.pieces_misses == 0
    assert fast._pieces is not None and fast._pieces.hits == 40


def test_the_template_is_not_rendered_between_verifications(tokenizer: Any) -> None:
    conversation = play(tokenizer, 2, 5)
    renders = []
    original = conversation.tokenizer.apply_chat_template

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(tokenizer, name)

        def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
            renders.append(1)
            return original(*args, **kwargs)

    conversation.tokenizer = Counting()
    conversation._compiled = False   # the windowed path goes through apply_chat_template
    sampled = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    conversation.add_assistant(sampled, [0.0] * len(sampled), "stop")
    conversation.add_messages([{"role": "tool", "name": "bash", "tool_call_id": "call_x", "content": "new text"}])
    assert renders == []
    reference = play(tokenizer, None, 5)
    reference.add_assistant(sampled, [0.0] * len(sampled), "stop")
    reference.add_messages([{"role": "tool", "name": "bash", "tool_call_id": "call_x", "content": "new text"}])
    assert conversation.input_ids == reference.input_ids


@pytest.mark.parametrize(("edit", "hits"), [
    # trims the content: a marker with whitespace at its ends does not survive, pieces unused
    (("message['content'] + '\\n</tool_response>", "message['content'] | trim + '\\n</tool_response>"), 0),
    # prints the call id: part of the key, so each turn gets its own pieces
    (("'<|im_start|>tool\\n<tool_response>\\n'", "'<|im_start|>tool ' + message['tool_call_id'] + '\\n<tool_response>\\n'"), 12),
    # branches on the tool's name without printing it: the name keys the pieces
    (("'<|im_start|>tool\\n<tool_response>\\n'",
      "('<|im_start|>tool\\n<tool_response>\\n' if message['name'] == 'bash' else '<|im_start|>tool\\n<py>\\n')"), 12),
    # wraps empty outputs differently: the content decides, which a probe content shows
    (("'<|im_start|>tool\\n<tool_response>\\n'",
      "('<|im_start|>tool\\n<tool_response>\\n' if message['content'] else '<|im_start|>tool\\n<tool_response>empty')"), 0),
])
def test_templates_the_pieces_cannot_serve_still_give_the_full_renders_ids(
        tokenizer: Any, edit: tuple[str, str], hits: int) -> None:
    changed = copy.deepcopy(tokenizer)
    assert edit[0] in changed.chat_template
    changed.chat_template = changed.chat_template.replace(edit[0], edit[1])
    fast, full = play(changed, 2, 12), play(changed, None, 12)
    assert fast.input_ids == full.input_ids
    assert fast._pieces is not None and fast._pieces.hits == hits


def test_reply_text_decodes_as_the_tokenizer_does_and_keeps_its_clean_up(tokenizer: Any) -> None:
    """reply_text decodes through the Rust tokenizer only where that gives the wrapper's text: the
    same text for any ids here, and a tokenizer that cleans up spaces keeps its own decode."""
    import copy
    import random

    from orchestrator.agent.messages import _decoder, reply_text

    assert _decoder(tokenizer).__name__ == "fast"
    chosen = random.Random(7)
    for _ in range(200):
        ids = [chosen.randrange(len(tokenizer)) for _ in range(chosen.randrange(1, 40))] + [tokenizer.eos_token_id]
        for reason in ("stop", "length"):
            kept = ids[:-1] if reason == "stop" else ids
            assert reply_text(tokenizer, ids, reason) == tokenizer.decode(kept, skip_special_tokens=False)
    cleaning = copy.copy(tokenizer)
    cleaning.clean_up_tokenization_spaces = True
    assert _decoder(cleaning).__name__ == "slow"
