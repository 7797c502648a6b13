"""The typed fields of the APIs' requests. A value of the wrong type (`"stream": "yes"`,
`"temperature": "0.5"`) or outside the API's documented range is refused with 400 naming the
field and what it takes, as the real APIs do. Accepted, it would be read as something else
(`bool("no")` is true) or reach the backend, which refuses it and so ends the job as if the
backend had failed. `null` stands for an absent field.

    check_typed(body, CHAT_FIELDS)          # each API module has its own table
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.proxy.bad_request import BadRequest


@dataclass(frozen=True)
class Rule:
    takes: str                          # what a refusal says the field must be
    accepts: Callable[[Any], bool]
    why: str = ""                       # added to the refusal


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(low: float, high: float) -> Rule:
    return Rule(f"a number from {low:g} to {high:g}", lambda v: _number(v) and low <= v <= high)


FLAG = Rule("true or false", lambda v: isinstance(v, bool))
TEXT = Rule("a string", lambda v: isinstance(v, str))
OBJECT = Rule("a JSON object", lambda v: isinstance(v, dict))
INTEGER = Rule("an integer", _integer)
POSITIVE = Rule("a positive integer", lambda v: _integer(v) and v >= 1)
POSITIVE_NUMBER = Rule("a positive number", lambda v: _number(v) and v > 0)
TEXTS = Rule("a string or a list of strings",
             lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)))
ONE = Rule("1", lambda v: _integer(v) and v == 1, " (the proxy records one sample per call)")
PROBABILITY = number(0, 1)
PENALTY = number(-2, 2)


def check_typed(body: Mapping[str, Any], rules: Mapping[str, Rule]) -> None:
    for name, rule in rules.items():
        value = body.get(name)
        if value is not None and not rule.accepts(value):
            raise BadRequest(f"{name} must be {rule.takes}, got {_shown(value)}{rule.why}", param=name)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
