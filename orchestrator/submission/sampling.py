"""Sampling parameters of a submission: known names only (a typo must not be dropped silently by
the server), values in range. Unknown names pass only when asked (`--sampling-unchecked`)."""

from __future__ import annotations

import difflib
from typing import Any, Callable

# vLLM SamplingParams and its OpenAI completions layer, and SGLang's sampling_params.
KNOWN = frozenset({
    "n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature",
    "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "bad_words", "ignore_eos",
    "max_tokens", "min_tokens", "logprobs", "prompt_logprobs", "detokenize", "skip_special_tokens",
    "spaces_between_special_tokens", "include_stop_str_in_output", "truncate_prompt_tokens",
    "logit_bias", "allowed_token_ids", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "structured_outputs", "response_format", "length_penalty", "extra_args", "priority",
    "max_new_tokens", "min_new_tokens", "json_schema", "regex", "ebnf", "no_stop_trim", "custom_params",
})

# name -> (whole numbers only, the range as people read it, the check of a number)
RANGES: dict[str, tuple[bool, str, Callable[[float], bool]]] = {
    "temperature": (False, ">= 0", lambda v: v >= 0),
    "top_p": (False, "in (0, 1]", lambda v: 0 < v <= 1),
    "top_k": (True, ">= -1", lambda v: v >= -1),
    "min_p": (False, "in [0, 1]", lambda v: 0 <= v <= 1),
    "max_tokens": (True, ">= 1", lambda v: v >= 1),
    "max_new_tokens": (True, ">= 1", lambda v: v >= 1),
    "seed": (True, "any whole number", lambda v: True),
}


def sampling_problem(params: dict[str, Any], unchecked: bool = False) -> str | None:
    """None when `params` are fine, else what is wrong and how to fix it (one line)."""
    for key, value in params.items():
        if key not in KNOWN and not unchecked:
            close = difflib.get_close_matches(key, sorted(KNOWN), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            return (f"unknown sampling parameter '{key}': {hint}valid: {', '.join(sorted(KNOWN))} "
                    "(a parameter your server takes that is not listed passes with --sampling-unchecked)")
        problem = _value_problem(key, value)
        if problem:
            return problem
    return None


def _value_problem(key: str, value: Any) -> str | None:
    rule = RANGES.get(key)
    if rule is None:
        return None
    whole, shown, within = rule
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"sampling parameter {key}={value!r} is not a number: give {'a whole number' if whole else 'a number'} {shown}"
    if whole and not isinstance(value, int):
        return f"sampling parameter {key}={value!r} is not a whole number: give one {shown}"
    if not within(value):
        return f"sampling parameter {key}={value!r} is out of range: {key} must be {shown}"
    return None
