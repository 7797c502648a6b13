"""Trajectory rows: the stable, documented columns of every shard (see README, "Shard columns")."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import orjson
import pyarrow as pa

from orchestrator.spool.jobs import JobStatus
from orchestrator.spool.tickets import Ticket
from orchestrator.spool.turn_columns import TurnRewardsError, checked_turn_rewards, turn_spans

# Keys of a stage output that `final_result` maps onto shard columns (below).
TRAJECTORY_KEYS = (
    "prompt_ids", "response_ids", "response_mask", "logprobs", "turns", "reward",
    "stop_reason", "tool_calls", "malformed_calls", "turn_rewards",
)


TURN_TYPE = pa.struct([
    ("input_ids", pa.list_(pa.int32())),
    ("output_ids", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("backend", pa.string()),
    ("policy_version", pa.int64()),
    ("finish_reason", pa.string()),
    ("switched_from", pa.string()),          # the backend this turn moved away from (it failed)
    ("logprob_mode", pa.string()),           # e.g. vLLM raw (before temperature) vs SGLang processed
    ("sent_at", pa.float64()),               # epoch seconds the request was sent
    ("latency_s", pa.float64()),             # request sent to answer parsed
    ("model", pa.string()),                  # model id the backend served
    ("tokenizer_hash", pa.string()),         # sha256:<16 hex> of the tokenizer files, when local
])
TOOL_CALL_TYPE = pa.struct([
    ("turn", pa.int32()),                    # the model turn (1-based) that made the call
    ("name", pa.string()),
    ("arguments", pa.string()),              # JSON
    ("exit_code", pa.int32()),               # null: the call did not run (invalid) or has no status
    ("output_chars", pa.int64()),            # size of the output before it was cut
    ("latency_ms", pa.float64()),
    ("error", pa.string()),
    ("output", pa.string()),                 # head + tail of what the model saw
])
TURN_SPAN_TYPE = pa.struct([                  # orchestrator/spool/turn_columns.py
    ("start", pa.int32()),                   # the turn's sampled tokens are response_ids[start:end]
    ("end", pa.int32()),
    ("policy_version", pa.int64()),          # the policy that sampled them
])
TIMESTAMP = pa.timestamp("us", tz="UTC")

SCHEMA = pa.schema([
    ("job_id", pa.string()),
    ("group_id", pa.string()),
    ("instance_id", pa.string()),
    ("sample_index", pa.int32()),
    ("group_size", pa.int32()),
    ("handler", pa.string()),
    ("data_source", pa.string()),
    ("status", pa.string()),                 # ok | failed | timeout | cancelled
    ("reward", pa.float64()),
    ("prompt_ids", pa.list_(pa.int32())),
    ("response_ids", pa.list_(pa.int32())),
    ("response_mask", pa.list_(pa.int8())),  # 1 = sampled by the model, 0 = observation/tool
    ("logprobs", pa.list_(pa.float32())),    # aligned with response_ids; 0.0 where the mask is 0
    ("sampled_tokens", pa.int32()),          # tokens sampled by the model (1s in response_mask)
    ("turns", pa.list_(TURN_TYPE)),
    ("policy_version_min", pa.int64()),
    ("policy_version_max", pa.int64()),
    ("model", pa.string()),                  # model id(s) that sampled the turns, in order of use
    ("tokenizer_hash", pa.string()),         # tokenizer identity(ies) of those turns
    ("logprob_mode", pa.string()),           # raw | processed: the kind(s) of logprobs of those turns
    ("init_s", pa.float64()),
    ("run_s", pa.float64()),
    ("eval_s", pa.float64()),
    ("queue_s", pa.float64()),
    ("counted_s", pa.float64()),             # init_s + run_s + eval_s: what the budget is charged
    ("submitted_at", TIMESTAMP),
    ("run_started_at", TIMESTAMP),
    ("run_ended_at", TIMESTAMP),
    ("finished_at", TIMESTAMP),
    ("worker", pa.string()),                 # worker that wrote the row
    ("node", pa.string()),                   # node that ran INIT and RUN
    ("attempt", pa.int32()),
    ("error_stage", pa.string()),
    ("error", pa.string()),
    ("instance", pa.string()),               # JSON
    ("sampling", pa.string()),               # JSON
    ("result", pa.string()),                 # JSON: stage outputs outside the columns above
    ("stop_reason", pa.string()),            # agents: finished | max_turns | context_full | timeout | error | cancelled
    ("tool_calls", pa.list_(TOOL_CALL_TYPE)),  # agents: every tool call, in order
    ("malformed_calls", pa.int32()),         # agents: calls that could not be parsed or run as written
    # Added for long-horizon agents (issue 26); shards written before lack them and read as null.
    ("staleness", pa.string()),              # restart | continue: what the job did when its policy fell behind
    ("turn_spans", pa.list_(TURN_SPAN_TYPE)),  # per turn: where its tokens sit in response_ids, its version (null: not in this sequence)
    ("turn_rewards", pa.list_(pa.float64())),  # per turn: a process reward from the handler, or null
])


def _stamp(seconds: float | None) -> datetime | None:
    if not seconds:
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _int_list(value: Any) -> list[int] | None:
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else None


def _float_list(value: Any) -> list[float] | None:
    if not isinstance(value, (list, tuple)):
        return None
    return [float(v) if v is not None and math.isfinite(float(v)) else float("nan") for v in value]


def _turns(value: Any) -> list[dict[str, Any]] | None:
    if not isinstance(value, list):
        return None
    turns = []
    for turn in value:
        if not isinstance(turn, dict):
            continue
        turns.append({
            "input_ids": _int_list(turn.get("input_ids")),
            "output_ids": _int_list(turn.get("output_ids")),
            "logprobs": _float_list(turn.get("logprobs")),
            "backend": turn.get("backend"),
            "policy_version": turn.get("policy_version"),
            "finish_reason": turn.get("finish_reason"),
            "switched_from": turn.get("switched_from"),
            "logprob_mode": turn.get("logprob_mode"),
            "sent_at": turn.get("sent_at"),
            "latency_s": turn.get("latency_s"),
            "model": turn.get("model"),
            "tokenizer_hash": turn.get("tokenizer_hash"),
        })
    return turns


def _distinct(values: list[Any]) -> str | None:
    """Distinct non-empty values in order of first use, comma-separated (usually just one)."""
    seen = [str(v) for v in dict.fromkeys(values) if v]
    return ",".join(seen) if seen else None


def _sampled_tokens(mask: list[int] | None, turns: list[dict[str, Any]] | None) -> int | None:
    if mask is not None:
        return sum(1 for m in mask if m == 1)
    if turns:
        return sum(len(t["output_ids"] or ()) for t in turns)
    return None


def _tool_calls(value: Any) -> list[dict[str, Any]] | None:
    if not isinstance(value, list):
        return None
    return [{name: call.get(name) for name in TOOL_CALL_TYPE.names} for call in value if isinstance(call, dict)]


def build_row(ticket: Ticket, merged: dict[str, Any], status: JobStatus, worker: str) -> dict[str, Any]:
    """One shard row from a finished ticket and the handler's merged outputs."""
    job = ticket.job
    timings = ticket.timings
    turns = _turns(merged.get("turns"))
    versions = [t["policy_version"] for t in turns or [] if t["policy_version"] is not None]
    extra = {k: v for k, v in merged.items() if k not in TRAJECTORY_KEYS}
    error = ticket.error or {}
    reward = merged.get("reward")
    mask = _int_list(merged.get("response_mask"))
    prompt_ids, response_ids = _int_list(merged.get("prompt_ids")), _int_list(merged.get("response_ids"))
    try:
        turn_rewards = checked_turn_rewards(merged.get("turn_rewards"), len(turns or ()))
    except TurnRewardsError as exc:   # a handler's mistake: the row keeps everything else, and says why
        turn_rewards, extra["turn_rewards_error"] = None, str(exc)
    return {
        "job_id": job.job_id,
        "group_id": job.group_id,
        "instance_id": job.instance_id,
        "sample_index": job.sample_index,
        "group_size": job.group_size,
        "handler": job.handler,
        "data_source": job.data_source or job.handler,
        "status": status.value,
        "reward": float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "response_mask": mask,
        "logprobs": _float_list(merged.get("logprobs")),
        "sampled_tokens": _sampled_tokens(mask, turns),
        "turns": turns,
        "policy_version_min": extra.pop("policy_version_min", min(versions) if versions else None),
        "policy_version_max": extra.pop("policy_version_max", max(versions) if versions else None),
        # A handler without an LLM session may name its model and tokenizer itself.
        "model": extra.pop("model", None) or _distinct([t["model"] for t in turns or []]),
        "tokenizer_hash": extra.pop("tokenizer_hash", None) or _distinct([t["tokenizer_hash"] for t in turns or []]),
        "logprob_mode": _distinct([t["logprob_mode"] for t in turns or []]),
        "init_s": timings.get("init_s"),
        "run_s": timings.get("run_s"),
        "eval_s": timings.get("eval_s"),
        "queue_s": timings.get("queue_s"),
        "counted_s": ticket.counted_s(),
        "submitted_at": _stamp(job.submitted_at),
        "run_started_at": _stamp(timings.get("run_started_at")),
        "run_ended_at": _stamp(timings.get("run_ended_at")),
        "finished_at": _stamp(timings.get("finished_at")),
        "worker": worker,
        "node": ticket.node or None,
        "attempt": ticket.attempt,
        "error_stage": error.get("stage"),
        "error": f"{error.get('kind')}: {error.get('message')}" if error else None,
        "instance": orjson.dumps(job.instance, default=str).decode(),
        "sampling": orjson.dumps(job.sampling, default=str).decode(),
        "result": orjson.dumps(extra, default=str).decode() if extra else None,
        "stop_reason": merged.get("stop_reason") if isinstance(merged.get("stop_reason"), str) else None,
        "tool_calls": _tool_calls(merged.get("tool_calls")),
        "malformed_calls": merged.get("malformed_calls") if isinstance(merged.get("malformed_calls"), int) else None,
        "staleness": job.staleness,
        "turn_spans": turn_spans(prompt_ids, response_ids, turns),
        "turn_rewards": turn_rewards,
    }


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)
