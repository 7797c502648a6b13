"""The agent's windowed observation rendering equals the full-history rendering, and a
template whose delta depends on the whole history (or on the tools) turns windowing off."""

from __future__ import annotations

import copy

from orchestrator.agent.tools import openai_tools, tool_specs
from orchestrator.llm.conversation import Conversation
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.tokenizer import load_tokenizer

TOOLS = openai_tools(tool_specs(["bash", "finish"]))
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "true"}}\n</tool_call>'


def play(tokenizer, window: int | None, turns: int = 40) -> Conversation:  # type: ignore[no-untyped-def]
    conversation = Conversation(tokenizer, [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Run true."}], tools=TOOLS, window=window)
    sampled = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    for turn in range(turns):
        conversation.add_assistant(sampled, [0.0] * len(sampled), "stop")
        conversation.add_messages([{"role": "tool", "content": f"output {turn}"}])
    return conversation


def test_windowed_rendering_gives_the_same_ids_as_the_full_history() -> None:
    tokenizer = load_tokenizer(tiny_model_dir())
    windowed, full = play(tokenizer, window=2), play(tokenizer, window=None)
    assert windowed.input_ids == full.input_ids and windowed.window_misses == 0


def test_a_template_that_counts_the_history_turns_windowing_off() -> None:
    tokenizer = copy.deepcopy(load_tokenizer(tiny_model_dir()))
    # Numbers every tool result by its position: a windowed render would number them wrongly.
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "'<|im_start|>tool\\n<tool_response>\\n'", "'<|im_start|>tool\\n<tool_response>' + (loop.index|string) + '\\n'")
    assert "loop.index" in tokenizer.chat_template
    windowed, full = play(tokenizer, window=2, turns=6), play(tokenizer, window=None, turns=6)
    assert windowed.window_misses == 1
    assert windowed.input_ids == full.input_ids
