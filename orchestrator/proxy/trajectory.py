"""Training samples from a job's recorded calls, by builder.

    per_request      one sample per call: prompt = the call's input ids, response = its sampled
                     ids (mask 1)
    prefix_merging   calls that extend each other merged into one sequence: prompt = the first
                     call's input ids, response = sampled ids (mask 1) and, between them, the ids
                     the next call added (observations, template text; mask 0, logprob 0.0). A call
                     whose input does not start with an open sequence's ids starts a new sample
                     (e.g. after the harness dropped early messages).
A call the harness cancelled (it closed the connection before its answer) is in no sample.

Samples are built from ids alone (a sequence is extended only when its ids are a verbatim prefix
of the call's input), so `samples_of(row)` rebuilds them from a shard row's `turns` column.
The row's own prompt_ids / response_ids / response_mask / logprobs hold the sample of the last
call; its `result` JSON holds {"builder", "samples": [[call indices], ...], "cancelled": [call indices]}.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class Builder(str, enum.Enum):
    PER_REQUEST = "per_request"
    PREFIX_MERGING = "prefix_merging"

    @classmethod
    def parse(cls, value: Any) -> "Builder":
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"trajectory builder {value!r}: choose one of "
                             f"{', '.join(b.value for b in cls)}") from None


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]
    calls: list[int]

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def extended_by(self, input_ids: Sequence[int]) -> bool:
        size = len(self.prompt_ids) + len(self.response_ids)
        return len(input_ids) >= size and list(input_ids[:size]) == self.ids

    def to_json(self) -> dict[str, Any]:
        return {"prompt_ids": self.prompt_ids, "response_ids": self.response_ids,
                "response_mask": self.response_mask, "logprobs": self.logprobs}


def _ids(call: dict[str, Any], key: str) -> list[int]:
    return [int(i) for i in call.get(key) or ()]


def build_samples(calls: Sequence[dict[str, Any]], builder: Builder) -> list[Sample]:
    """Samples of `calls` (dicts with input_ids, output_ids, logprobs), in order of first call."""
    samples: list[Sample] = []
    for index, call in enumerate(calls):
        if call.get("cancelled"):   # sampled, but the harness left before seeing it
            continue
        inputs, outputs = _ids(call, "input_ids"), _ids(call, "output_ids")
        logprobs = [float(x) for x in call.get("logprobs") or ()]
        target = None
        if builder is Builder.PREFIX_MERGING:
            target = next((s for s in reversed(samples) if s.extended_by(inputs)), None)
        if target is None:
            samples.append(Sample(inputs, list(outputs), [1] * len(outputs), logprobs, [index]))
            continue
        added = inputs[len(target.prompt_ids) + len(target.response_ids):]
        target.response_ids += added + outputs
        target.response_mask += [0] * len(added) + [1] * len(outputs)
        target.logprobs += [0.0] * len(added) + logprobs
        target.calls.append(index)
    return samples


def trajectory_fields(calls: Sequence[dict[str, Any]], builder: Builder) -> dict[str, Any]:
    """The row's trajectory keys: the last call's sample in the columns, every sample's calls."""
    samples = build_samples(calls, builder)
    answered = [i for i, call in enumerate(calls) if not call.get("cancelled")]
    main = next((s for s in samples if answered and answered[-1] in s.calls), None)
    out: dict[str, Any] = main.to_json() if main else {
        "prompt_ids": [], "response_ids": [], "response_mask": [], "logprobs": []}
    out.update({"builder": builder.value, "samples": [s.calls for s in samples],
                "cancelled": [i for i, call in enumerate(calls) if call.get("cancelled")]})
    return out


def samples_of(row: dict[str, Any]) -> list[Sample]:
    """Every training sample of a `harness` shard row, rebuilt from its `turns` column."""
    result = row.get("result")
    info = json.loads(result) if isinstance(result, str) else (result or {})
    builder = Builder.parse(info.get("builder", Builder.PREFIX_MERGING.value))
    cancelled = set(info.get("cancelled") or ())   # the turns column has no such field: the result says which
    turns = [{**turn, "cancelled": index in cancelled} for index, turn in enumerate(row.get("turns") or [])]
    return build_samples(turns, builder)
