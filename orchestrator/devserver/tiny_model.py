"""A tiny real causal LM and tokenizer, built offline on CPU and cached.

`serve-llm --tiny` and the tests need a real model without hub access: a byte-level BPE
tokenizer is trained on text that ships with Python itself (the standard library's sources),
given special tokens and a chat template with tool calls, and a randomly initialised
Qwen2-style model of ~0.4 M parameters is saved next to it. The first build takes seconds;
later loads use `local_files_only=True`. The attention shape (head size 32) is one stock
vLLM serves on CPU too (its CPU attention supports head sizes 32, 64, 80, ... only).
"""

from __future__ import annotations

import logging
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock

from orchestrator.llm.tokenizer import cache_home

log = logging.getLogger(__name__)
BUILD_LOCK_TIMEOUT_S = 1800.0   # a build takes seconds to a minute; a holder this slow is stuck

# Bump when the recipe changes so an old cache is not reused.
RECIPE = "tiny-v2"
VOCAB_SIZE = 4096
CORPUS_BYTES = 3_000_000
SEED = 1234
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
]
# ChatML with tool calls. Jinja trims newlines after block tags, so newlines are explicit.
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n# Tools\\n' }}"
    "{%- for tool in tools -%}{{ tool | tojson }}{{ '\\n' }}{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{ '<|im_start|>tool\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}{%- endif -%}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{{ '\\n<tool_call>\\n' }}{{ fn | tojson }}{{ '\\n</tool_call>' }}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
# How transformers' `parse_response` reads a reply of that template back into a message (its
# `response_template`, transformers >= 5.13): TRL's tool loop finds the tool calls with it.
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def cache_root() -> Path:
    return cache_home() / "tiny"


def tiny_model_dir() -> Path:
    """Directory of the cached tiny model + tokenizer, built on first use."""
    return cached_model(RECIPE, build)


def cached_model(recipe: str, builder: Callable[[Path], None]) -> Path:
    """cache_root()/recipe, made by `builder(staging dir)` on first use and published by rename.

    The cache is node-local (~/.cache): processes of this node that ask at once wait on a
    `filelock` lock (released by the kernel if its holder dies) and build it once, not each its own."""
    target = cache_root() / recipe
    if _built(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{recipe}.lock"), timeout=BUILD_LOCK_TIMEOUT_S):
        if not _built(target):   # built by the holder we waited for
            _build(recipe, builder, target)
    return target


def _built(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "tokenizer.json").is_file()


def _build(recipe: str, builder: Callable[[Path], None], target: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{recipe}-", dir=target.parent))
    try:
        log.info("building the tiny model %s in %s (one time, offline)", recipe, target)
        builder(staging)
        try:
            os.rename(staging, target)  # atomic publish; a concurrent builder may have won
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def corpus() -> list[str]:
    """Deterministic local training text: the Python standard library's own sources."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total >= CORPUS_BYTES:
            break
    if total < 100_000:
        raise RuntimeError(f"too little local text under {stdlib} to train the tiny tokenizer")
    return texts


def build_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build(directory: Path) -> None:
    save_random_model(directory, build_tokenizer())


def save_random_model(directory: Path, tokenizer: Any) -> None:
    """Save `tokenizer` and a seeded random Qwen2-style model for its vocabulary in `directory`."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    tokenizer.save_pretrained(directory)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    # hidden 64 over 2 heads: head size 32, the smallest stock vLLM's CPU attention accepts.
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=256, tie_word_embeddings=True,
        max_position_embeddings=4096, bos_token_id=pad, eos_token_id=eos, pad_token_id=pad,
    )
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(directory)


# -- the small-vocabulary variant (the closed GRPO loop on CPU) --------------------------------
# One token per printable ASCII character (~100 tokens, every digit one token) makes a task like
# "answer with the digit the prompt names" learnable from a random start in ~130 GRPO steps of
# 8 x 8 samples (measured in-process here; a 300-token byte-level vocabulary needed ~210, the
# 4,096-token BPE far more). Same attention shape as the tiny model (hidden 64, 2 heads / 1 KV
# head: head size 32), so stock vLLM can serve it too. Other characters are dropped.
DIGITS_RECIPE = "tiny-ascii-v1"
ASCII_CHARACTERS = "".join(map(chr, range(32, 127))) + "\n"


def tiny_digits_model_dir() -> Path:
    """Directory of the cached character-level tiny model + tokenizer, built on first use."""
    return cached_model(DIGITS_RECIPE, build_digits)


def build_digits(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [*SPECIAL_TOKENS, "<unk>"]
    # Byte-level symbols (' ' is 'Ġ', '\n' is 'Ċ'), as Qwen2 tokenizers expect: transformers loads
    # this directory as a Qwen2 tokenizer and puts its byte-level pre-tokenizer back.
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    symbols = [byte_level.pre_tokenize_str(character)[0][0] for character in ASCII_CHARACTERS]
    vocab = {token: index for index, token in enumerate(specials + symbols)}
    characters = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))   # no merges: a token per character
    characters.pre_tokenizer = byte_level
    characters.decoder = decoders.ByteLevel()
    characters.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=characters, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    save_random_model(directory, tokenizer)


def save_perturbed_copy(source: Path, target: Path, seed: int, scale: float = 0.05) -> Path:
    """`source`'s model with seeded Gaussian noise on every weight, saved in `target`: another
    checkpoint of the same shape (for reload tests and benchmarks)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source), local_files_only=True)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    model.save_pretrained(target)
    return target
