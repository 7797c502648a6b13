"""Supervised steps on a tiny model: teach it a format before RL ever samples from it.

A random tiny model never writes `<answer>...</answer>` or a well-formed tool call, so the examples
and the tool-calling benchmark first fit it to replies of the right form (the loss on the reply
tokens only, the prompt's labels -100), on CPU, in seconds to a minute.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

IGNORED = -100   # a label transformers' loss skips

Example = tuple[list[int], list[int]]   # input ids, and their labels (IGNORED where nothing is learnt)


def labelled(tokenizer: Any, pieces: Sequence[tuple[str, bool]]) -> Example:
    """The ids of the pieces' texts, one after the other, each labelled with itself when its flag
    says it is learnt (a reply), else IGNORED (a prompt, a tool's output)."""
    ids: list[int] = []
    labels: list[int] = []
    for text, learnt in pieces:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if learnt else [IGNORED] * len(piece)
    return ids, labels


def teach(source: Path, target: Path, draw: Callable[[random.Random], list[Example]], steps: int, lr: float,
          seed: int) -> float:
    """`source`'s model fitted for `steps` AdamW steps, each on the batch `draw` makes (from a
    generator seeded with `seed`), saved with its tokenizer in `target`; returns the last loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(source), local_files_only=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        examples = draw(rng)
        width = max(len(ids) for ids, _ in examples)
        padding = [width - len(ids) for ids, _ in examples]
        ids = torch.tensor([row + [tokenizer.pad_token_id] * pad for (row, _), pad in zip(examples, padding)])
        mask = torch.tensor([[1] * len(row) + [0] * pad for (row, _), pad in zip(examples, padding)])
        labels = torch.tensor([row + [IGNORED] * pad for (_, row), pad in zip(examples, padding)])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return float(loss.item())
