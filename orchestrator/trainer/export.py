"""Export a run's groups as a distillation (SFT) or preference (DPO) set, in TRL's and verl's layouts.

Layouts (columns exactly as the trainers read them; no other column is written):
  sft, trl      prompt, completion          TRL SFTTrainer's prompt-completion type: conversational
                                            (lists of {role, content}) when a prompt is a chat,
                                            else strings
  sft, tokens   input_ids, completion_mask  TRL SFTTrainer's tokenized data (used as is, no
                                            template): prompt_ids + response_ids, and 0 over the
                                            prompt + response_mask (tool/observation tokens are 0)
  sft, verl     prompt, response, messages  verl's SFTDataset (data.prompt_key / response_key
                                            defaults) and MultiTurnSFTDataset (data.multiturn.
                                            enable=true, messages_key "messages")
  dpo, trl      prompt, chosen, rejected    TRL DPOTrainer's preference type, conversational or
                                            standard as for sft/trl

SFT takes the best-rewarded ok sample of each group (`every=True`: every ok sample), only if its
reward reaches `threshold`. DPO pairs the highest- and the lowest-rewarded ok samples of a group
(first by sample_index on ties); a group whose ok samples all have one reward gives no pair.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.spool import fsops
from orchestrator.trainer.export_text import Decode, Prompt, as_messages, completion_of, last_user_text, prompt_of
from orchestrator.trainer.replay_filter import QueryError

Row = dict[str, Any]
# The shard columns an export reads.
EXPORT_COLUMNS = ("instance_id", "status", "reward", "instance", "result", "prompt_ids", "response_ids", "response_mask")
SUFFIXES = (".parquet", ".jsonl")
Kind = Literal["sft", "dpo"]
Layout = Literal["trl", "tokens", "verl"]
# (kind, layout) -> the columns written, in order
LAYOUT_COLUMNS: dict[tuple[str, str], tuple[str, ...]] = {
    ("sft", "trl"): ("prompt", "completion"),
    ("sft", "tokens"): ("input_ids", "completion_mask"),
    ("sft", "verl"): ("prompt", "response", "messages"),
    ("dpo", "trl"): ("prompt", "chosen", "rejected"),
}


@dataclass
class Exported:
    records: list[dict[str, Any]] = field(default_factory=list)
    groups: int = 0
    skipped: Counter[str] = field(default_factory=Counter)   # why -> groups (DPO) or samples (SFT) left out


def export_records(groups: Sequence[Sequence[Row]], kind: Kind, layout: Layout, threshold: float | None = None,
                   every: bool = False, decode: Decode | None = None) -> Exported:
    """The records of `groups` in `layout`; what was left out is counted by reason."""
    if (kind, layout) not in LAYOUT_COLUMNS:
        valid = ", ".join(lay for k, lay in LAYOUT_COLUMNS if k == kind)
        raise QueryError(f"no {layout} layout for {kind}: valid are {valid}")
    out = Exported(groups=len(groups))
    for group in groups:
        scored = sorted((r for r in group if r["status"] == "ok" and r["reward"] is not None),
                        key=lambda r: (-r["reward"], r["sample_index"] or 0))
        if not scored:
            out.skipped["no ok sample with a reward"] += 1
        elif kind == "dpo":
            _pair(scored, decode, out)
        else:
            for row in scored if every else scored[:1]:
                if threshold is not None and row["reward"] < threshold:
                    out.skipped[f"reward below {threshold:g}"] += 1
                else:
                    _sample(row, layout, decode, out)
    if layout != "tokens":
        _one_prompt_type(out.records, ("completion", "chosen", "rejected"))
    return out


def _pair(scored: list[Row], decode: Decode | None, out: Exported) -> None:
    best, lowest = scored[0], scored[-1]["reward"]
    worst = next(r for r in scored if r["reward"] == lowest)   # first by sample_index among the lowest
    if best["reward"] == lowest:
        out.skipped["no reward spread (every ok sample has one reward)"] += 1
        return
    prompt, chosen, rejected = prompt_of(best), completion_of(best, decode), completion_of(worst, decode)
    if _missing_text(prompt, None if chosen is None or rejected is None else chosen, out):
        return
    out.records.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})


def _sample(row: Row, layout: Layout, decode: Decode | None, out: Exported) -> None:
    if layout == "tokens":
        prompt_ids, response_ids = row["prompt_ids"], row["response_ids"]
        if prompt_ids is None or response_ids is None:
            out.skipped["no token ids"] += 1
            return
        mask = row["response_mask"] if row["response_mask"] is not None else [1] * len(response_ids)
        out.records.append({"input_ids": [int(i) for i in (*prompt_ids, *response_ids)],
                            "completion_mask": [0] * len(prompt_ids) + [int(m) for m in mask]})
        return
    prompt, completion = prompt_of(row), completion_of(row, decode)
    if _missing_text(prompt, completion, out):
        return
    assert prompt is not None and completion is not None
    if layout == "trl":
        out.records.append({"prompt": prompt, "completion": completion})
    else:
        out.records.append({"prompt": last_user_text(prompt), "response": completion,
                            "messages": [*as_messages(prompt), {"role": "assistant", "content": completion}]})


def _missing_text(prompt: Prompt | None, completion: str | None, out: Exported) -> bool:
    if prompt is None:
        out.skipped["no prompt text in the task (messages, prompt or question)"] += 1
    elif completion is None:
        out.skipped["no response text (pass --tokenizer to decode response_ids)"] += 1
    return prompt is None or completion is None


def _one_prompt_type(records: list[dict[str, Any]], answers: tuple[str, ...]) -> None:
    """TRL reads one type per dataset: all conversational as soon as one prompt is a chat."""
    if not any(isinstance(r.get("prompt"), list) for r in records):
        return
    for record in records:
        record["prompt"] = as_messages(record["prompt"])
        for key in answers:
            if key in record:
                record[key] = [{"role": "assistant", "content": record[key]}]


def write_records(records: list[dict[str, Any]], columns: Sequence[str], out: Path) -> None:
    """Parquet or JSON lines by `out`'s suffix, written atomically (a reader sees no half file)."""
    if out.suffix not in SUFFIXES:
        raise QueryError(f"{out}: name the output *.parquet or *.jsonl (valid suffixes: {', '.join(SUFFIXES)})")
    if out.suffix == ".parquet":
        table = (pa.Table.from_pylist(records).select(list(columns)) if records
                 else pa.table({name: pa.array([], pa.string()) for name in columns}))
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue().to_pybytes()
    else:
        data = b"".join(orjson.dumps({name: record[name] for name in columns}) + b"\n" for record in records)
    fsops.write_atomic(out, data)
