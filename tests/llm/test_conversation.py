"""The conversation buffer: exact ids kept, only the template delta of new messages added."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.llm.conversation import Conversation, ChatTemplateError
from orchestrator.devserver.generation import Engine
from orchestrator.devserver.sampling import GenRequest
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.llm.tokenizer import load_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]


def tokenizer():
    return load_tokenizer(tiny_model_dir())


def test_prompt_is_the_chat_template_with_generation_prompt() -> None:
    tok = tokenizer()
    conversation = Conversation(tok, MESSAGES)
    expected = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert conversation.input_ids == list(expected)
    assert conversation.response_ids == [] and conversation.response_mask == []


def test_stop_then_user_turn_appends_only_the_rest_of_the_template() -> None:
    tok = tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    conversation = Conversation(tok, MESSAGES)
    sampled = [3000, 1234, 77, im_end]  # arbitrary ids: kept as they are, whatever they decode to
    conversation.add_assistant(sampled, [-1.0, -2.0, -3.0, -0.5], "stop")
    observed = conversation.add_messages([{"role": "user", "content": "More?"}])
    assert tok.decode(observed) == "\n<|im_start|>user\nMore?<|im_end|>\n<|im_start|>assistant\n"
    assert conversation.response_ids == sampled + observed
    assert conversation.response_mask == [1] * 4 + [0] * len(observed)
    assert conversation.logprobs == [-1.0, -2.0, -3.0, -0.5] + [0.0] * len(observed)


def test_reply_cut_by_max_tokens_gets_the_template_closing_as_observation() -> None:
    tok = tokenizer()
    conversation = Conversation(tok, MESSAGES)
    conversation.add_assistant([3000, 1234], [-1.0, -2.0], "length")
    observed = conversation.add_messages([{"role": "user", "content": "More?"}])
    assert tok.decode(observed).startswith("<|im_end|>\n<|im_start|>user\n")
    assert conversation.response_ids[:2] == [3000, 1234]


def test_tool_messages_render_as_observations() -> None:
    tok = tokenizer()
    conversation = Conversation(tok, MESSAGES)
    conversation.add_assistant([500, 501], [-1.0, -1.0], "length")
    observed = conversation.add_messages([{"role": "tool", "content": "42"}])
    assert "<tool_response>\n42\n</tool_response>" in tok.decode(observed)


def test_exact_ids_differ_from_a_re_rendered_history() -> None:
    """Sampled ids, decoded and re-rendered through the template, are not the ids we keep."""
    tok = tokenizer()
    engine = Engine(tiny_model_dir(), threads=1)
    differ = 0
    for seed in range(8):
        conversation = Conversation(tok, MESSAGES)
        result = engine.generate([GenRequest(tuple(conversation.input_ids), 12, seed=seed)])[0]
        conversation.add_assistant(result.output_ids, result.raw_logprobs, result.finish_reason)
        conversation.add_messages([{"role": "user", "content": "And?"}])
        rerendered = tok.apply_chat_template(conversation.messages, tokenize=True,
                                             add_generation_prompt=True, return_dict=False)
        differ += list(rerendered) != conversation.input_ids
    assert differ >= 4


def test_encoding_through_the_rust_tokenizer_gives_the_tokenizers_ids() -> None:
    tok = tokenizer()
    conversation = Conversation(tok, MESSAGES)
    texts = ["<|im_end|>\n<|im_start|>user\n<tool_response>\n-rw-r--r-- 1 agent 4096 f\u00e9\n</tool_response>",
             "  spaces\t\ttabs \u4f60\u597d <|im_start|>assistant\n", ""]
    assert [conversation.encode(t) for t in texts] == [list(tok.encode(t, add_special_tokens=False)) for t in texts]
    # A tokenizer configured to truncate is called the ordinary way (the shortcut would truncate).
    tok._tokenizer.enable_truncation(4)
    try:
        assert conversation.encode(texts[0]) == list(tok.encode(texts[0], add_special_tokens=False))
        assert len(conversation.encode(texts[0])) > 4
    finally:
        tok._tokenizer.no_truncation()


def test_mismatched_logprobs_are_refused() -> None:
    with pytest.raises(ValueError, match="2 output ids but 1 logprobs"):
        Conversation(tokenizer(), MESSAGES).add_assistant([1, 2], [-1.0], "stop")


def test_template_that_rewrites_history_is_named() -> None:
    tok = tokenizer()
    conversation = Conversation(tok, MESSAGES)
    conversation.add_assistant([500], [-1.0], "length")
    original = tok.chat_template
    try:  # a template that only ever shows the last message cannot be extended by a delta
        tok.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
        with pytest.raises(ChatTemplateError, match="earlier messages differently"):
            conversation.add_messages([{"role": "user", "content": "x"}])
    finally:
        tok.chat_template = original


def test_engine_batches_rows_like_single_requests() -> None:
    """Left-padded batched sampling gives each row what it would get alone (same seed)."""
    engine = Engine(tiny_model_dir(), threads=1)
    requests = [GenRequest((1, 2, 3, 4, 5, 6), 6, seed=1), GenRequest((7, 8), 9, temperature=0.7, seed=2)]
    batched = engine.generate(requests)
    for request, together in zip(requests, batched):
        alone = engine.generate([request])[0]
        assert together.output_ids == alone.output_ids
        assert together.raw_logprobs == pytest.approx(alone.raw_logprobs, abs=1e-4)

    async def concurrent():
        return await asyncio.gather(*(engine.submit(r) for r in requests))

    assert [r.output_ids for r in asyncio.run(concurrent())] == [r.output_ids for r in batched]


def test_the_samples_of_a_group_render_their_prompt_once() -> None:
    """A group's n samples start from the same messages: the chat template runs and the tokenizer
    encodes once for them, and the ids are those of a render of their own. Other messages, other
    tools or another template render anew."""
    tok = tokenizer()
    renders = []
    original = tok.apply_chat_template

    def counted(*args, **kwargs):
        renders.append(args)
        return original(*args, **kwargs)

    tok.apply_chat_template = counted
    group = [Conversation(tok, [dict(m) for m in MESSAGES]) for _ in range(4)]
    assert len(renders) == 1
    expected = original(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert all(c.prompt_ids == list(expected) for c in group)
    group[0].prompt_ids.append(7)   # each sample's ids are its own
    assert Conversation(tok, MESSAGES).prompt_ids == list(expected) and len(renders) == 1
    Conversation(tok, [*MESSAGES[:1], {"role": "user", "content": "Hi?"}])
    tool = {"type": "function", "function": {"name": "calc", "description": "adds", "parameters": {"type": "object"}}}
    with_tools = Conversation(tok, MESSAGES, tools=[tool])
    assert len(renders) == 3 and "calc" in tok.decode(with_tools.prompt_ids)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    assert tok.decode(Conversation(tok, MESSAGES).prompt_ids) == "Be brief.|Hi!|>" and len(renders) == 4


def test_a_reply_given_with_its_message_is_the_decoded_reply_then_described() -> None:
    """add_assistant(..., message) (the proxy's way: its parsed reply, no second decode) leaves
    the ids, the messages and every later delta as add_assistant + describe_last_assistant did."""
    tok = tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    sampled, logprobs = [3000, 1234, 77, im_end], [-1.0, -2.0, -3.0, -0.5]
    described = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}
    observation = [{"role": "tool", "tool_call_id": "call_0", "content": "a.txt\n"}]
    decoded, given = Conversation(tok, MESSAGES, window=2), Conversation(tok, MESSAGES, window=2)
    decoded.add_assistant(sampled, logprobs, "stop")
    decoded.describe_last_assistant(described)
    assert given.add_assistant(sampled, logprobs, "stop", described) == ""
    for _ in range(3):   # past the first renders, whose delta is checked against the full render
        assert given.messages == decoded.messages
        assert given.add_messages(observation) == decoded.add_messages(observation)
        decoded.add_assistant(sampled, logprobs, "stop")
        decoded.describe_last_assistant(described)
        given.add_assistant(sampled, logprobs, "stop", described)
    assert (given.to_json(), given.messages) == (decoded.to_json(), decoded.messages)


def test_a_turn_hands_over_its_lists_only_when_asked() -> None:
    from orchestrator.llm.session import Turn

    turn = Turn([1, 2, 3], [4], [-0.5], "b", 0, "stop", "raw")
    copied, handed = turn.to_json(), turn.to_json(copy=False)
    assert copied == handed and "parts" not in copied
    assert copied["input_ids"] is not turn.input_ids and handed["input_ids"] is turn.input_ids
