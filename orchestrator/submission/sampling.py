"""Sampling parameters of a submission: known names only (a typo must not be dropped silently by
the server), values in range. Unknown names pass only when asked (`--sampling-unchecked`)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from orchestrator.settings_spec import Family, checked, declarations, setting

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



@dataclass(frozen=True)
class RangedSampling:
    """The parameters whose values are checked here (the rest are the server's to read)."""

    temperature: float = setting(1.0, "randomness of sampling; 0: greedy", bounds=(0, None))
    top_p: float = setting(1.0, "sample from the likeliest tokens whose probabilities add up to this",
                           bounds=(0, 1), low_excluded=True)
    top_k: int = setting(-1, "sample among this many likeliest tokens; -1: all", bounds=(-1, None))
    min_p: float = setting(0.0, "leave out tokens below this fraction of the likeliest one's probability",
                           bounds=(0, 1))
    max_tokens: int = setting(16, "tokens sampled at most (vLLM)", bounds=(1, None))
    max_new_tokens: int = setting(128, "tokens sampled at most (SGLang)", bounds=(1, None))
    seed: int | None = setting(None, "the seed of the server's sampling", kind=int)


# An int or float (a whole number's: an int), never a bool, never None: what a submission always took.
SAMPLING = Family("sampling parameter", none_is_unset=False,
                  out_of_range="sampling parameter {name}={value!r} is out of range: {name} must be {range}",
                  not_a_number="sampling parameter {name}={value!r} is not {kind}: give one {range}")
RANGED = declarations(RangedSampling)


def sampling_problem(params: dict[str, Any], unchecked: bool = False) -> str | None:
    """None when `params` are fine, else what is wrong and how to fix it (one line)."""
    for key, value in params.items():
        if key not in KNOWN and not unchecked:
            close = difflib.get_close_matches(key, sorted(KNOWN), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            return (f"unknown sampling parameter '{key}': {hint}valid: {', '.join(sorted(KNOWN))} "
                    "(a parameter your server takes that is not listed passes with --sampling-unchecked)")
        if key in RANGED:
            try:
                checked(RangedSampling, {key: value}, SAMPLING)
            except ValueError as refused:
                return str(refused)
    return None
