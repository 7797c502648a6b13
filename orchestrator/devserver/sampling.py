"""One request's sampling for the reference server: what it asks for, what it gets, and how
one token is drawn from a row of logits.

Every sampled token comes with two logprobs: `raw` (log_softmax of the logits, vLLM's default)
and `processed` (after temperature, SGLang's default), so the server can answer either protocol
faithfully.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass
class GenResult:
    output_ids: list[int] = field(default_factory=list)
    raw_logprobs: list[float] = field(default_factory=list)
    processed_logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    matched_stop: int | None = None


def sample(torch: Any, logits: Any, request: GenRequest, rng: Any) -> tuple[int, float]:
    """One token id and its logprob after temperature (before top-p/top-k filtering)."""
    if request.temperature <= 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, -1)[token])
    scaled = logits / request.temperature
    processed = torch.log_softmax(scaled, -1)
    filtered = scaled.clone()
    if request.top_k > 0:
        kth = torch.topk(filtered, min(request.top_k, filtered.numel())).values[-1]
        filtered[filtered < kth] = -math.inf
    if request.top_p < 1.0:
        order = torch.argsort(filtered, descending=True)
        cumulative = torch.softmax(filtered[order], -1).cumsum(-1)
        drop = cumulative - torch.softmax(filtered[order], -1) > request.top_p
        filtered[order[drop]] = -math.inf
    probs = torch.softmax(filtered, -1)
    token = int(torch.multinomial(probs, 1, generator=rng))
    return token, float(processed[token])
