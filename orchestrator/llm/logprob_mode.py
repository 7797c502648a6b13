"""Which logprobs a backend returns: `raw` (log_softmax of the logits) or `processed` (after
temperature, the distribution actually sampled from).

It is a property of the server, fixed when it starts (vLLM `--logprobs-mode`, default raw;
SGLang: always processed; `serve-llm --logprobs-mode`), so it is recorded in the registry at
`backend add`: the `--logprob-mode` flag, else what the server says in `GET /v1/models`
(`logprobs_mode`, as serve-llm and verl's own vLLM servers are configured), else the protocol's
documented default. Clients label every turn with the entry's mode; nothing guesses later.
At temperature 1 the two agree; elsewhere a trainer comparing its own logprobs with the wrong
kind gets wrong importance ratios, which is why verl's manager refuses a mismatch.
"""

from __future__ import annotations

import enum
from typing import Any

from orchestrator.llm.errors import RegistryError


class LogprobMode(str, enum.Enum):
    RAW = "raw"              # vLLM's default
    PROCESSED = "processed"  # after temperature: SGLang's default, verl's rollout default


# The spellings servers and trainers use (vLLM's --logprobs-mode, verl's rollout.logprobs_mode).
ALIASES = {"raw_logprobs": LogprobMode.RAW, "processed_logprobs": LogprobMode.PROCESSED}


def parse_logprob_mode(value: Any, what: str = "logprob mode") -> LogprobMode:
    """`raw`/`processed` (or vLLM's `raw_logprobs`/`processed_logprobs`); RegistryError otherwise."""
    if isinstance(value, LogprobMode):
        return value
    text = str(value).strip().lower()
    if text in ALIASES:
        return ALIASES[text]
    try:
        return LogprobMode(text)
    except ValueError:
        raise RegistryError(
            f"{what} {value!r} is not valid: use raw or processed (vLLM's raw_logprobs / processed_logprobs "
            "also work); raw_logits and processed_logits are not logprobs and cannot be trained on"
        ) from None


def protocol_default(protocol: str) -> LogprobMode:
    """What a stock server of `protocol` returns when it says nothing (llm-protocols.md)."""
    return LogprobMode.PROCESSED if protocol == "sglang" else LogprobMode.RAW


def announced_mode(models_answer: Any) -> LogprobMode | None:
    """The mode a server announces in its GET /v1/models answer (first model's `logprobs_mode`)."""
    try:
        value = models_answer["data"][0].get("logprobs_mode")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if value is None:
        return None
    try:
        return parse_logprob_mode(value)
    except RegistryError:
        return None   # logits modes: nothing a trainer can use; the flag must say what to record


def ask_server(url: str, timeout_s: float = 5.0) -> LogprobMode | None:
    """What the server at `url` announces in GET /v1/models; None when it says nothing or is down."""
    import httpx

    from orchestrator.llm.urls import endpoint

    try:
        answer = httpx.get(endpoint(url, "/v1/models"), timeout=timeout_s)
        return announced_mode(answer.json()) if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def resolve_logprob_mode(url: str, protocol: str, given: str | None, ask: bool = True) -> tuple[LogprobMode, str]:
    """The mode to record at `backend add` and where it came from: the flag, the server, the protocol.

    `ask` False (the server does not answer yet): the protocol's default, said so.
    """
    if given is not None:
        return parse_logprob_mode(given, "--logprob-mode"), "given"
    announced = ask_server(url) if ask else None
    if announced is not None:
        return announced, "announced by the server"
    why = "the server does not say" if ask else "the server does not answer yet; --logprob-mode sets it"
    return protocol_default(protocol), f"{protocol}'s default ({why})"
