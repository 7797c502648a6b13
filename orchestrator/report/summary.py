"""The report in words and numbers: the summary table of the page, the text printed, numbers.json."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from orchestrator.report.durations import format_seconds
from orchestrator.report.model import RunReport


def _number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def summary_pairs(report: RunReport) -> list[tuple[str, str]]:
    f = report.finished
    statuses = ", ".join(f"{status} {count}" for status, count in f.by_status.items()) or "none"
    pairs = [
        ("finished jobs", f"{f.jobs} ({statuses})"),
        ("reward mean", f"{_number(f.reward_mean)} over {f.rewarded} rewarded row(s)"),
        ("pass rate", f"{_number(f.pass_rate)} (reward >= {f.pass_reward:g}, cancelled rows left out)"),
        ("sampled tokens", str(f.tokens)),
        ("span", f"{f.span_s:.1f} s (first RUN start to last finish)"),
        ("jobs/s", _number(f.jobs_per_s)),
        ("tokens/s", _number(f.tokens_per_s)),
    ]
    warm_ups = sorted(w.warm_up_s for w in report.workers if w.warm_up_s is not None)
    if warm_ups:
        pairs.append(("worker warm-up", f"median {format_seconds(warm_ups[len(warm_ups) // 2])}, max "
                                        f"{format_seconds(warm_ups[-1])} over {len(warm_ups)} worker(s): tokenizers "
                                        "loaded before RUN, in no job's RUN time"))
    if report.turn_latency is not None:
        t = report.turn_latency
        pairs.append(("LLM turns", f"{t.count}, latency p50 {format_seconds(t.p50)}, p90 {format_seconds(t.p90)}, "
                                   f"p99 {format_seconds(t.p99)}"))
    used = [b for b in report.backends if b.turns]
    if report.backends:
        switches = sum(b.switched_away for b in report.backends)
        pairs.append(("backends", f"{len(used)} used of {len(report.backends)} known; {switches} switch(es) after a failure; "
                                  f"{len(report.down)} down period(s); {sum(c.change == 'version' for c in report.version_changes)} version change(s)"))
    if f.failure_counts:
        pairs.append(("not ok, by kind", ", ".join(f"{kind} {count}" for kind, count in f.failure_counts.items())))
    if report.tools:
        pairs.append(("tool calls", ", ".join(f"{t.name} {t.calls}" for t in report.tools)))
    if report.skipped:
        pairs.append(("could not read", f"{len(report.skipped)} item(s), listed at the top"))
    return pairs


def summary_text(report: RunReport, page: str) -> str:
    lines = [f"report of {report.run_dir}: {page}"]
    width = max(len(label) for label, _ in summary_pairs(report))
    lines += [f"  {label:<{width}}  {value}" for label, value in summary_pairs(report)]
    if report.finished.latency:
        lines.append(f"  {'time per stage':<18} {'p50':>10} {'p90':>10} {'p99':>10}")
        for stage, p in report.finished.latency.items():
            lines.append(f"    {stage:<16} " + " ".join(f"{format_seconds(v):>10}" for v in (p.p50, p.p90, p.p99)))
    for group in report.finished.failures[:10]:
        lines.append(f"  {group.count:6d} {group.status} in {group.stage}: {group.kind}  e.g. {', '.join(group.examples)}")
    for item in report.skipped:
        lines.append(f"  skipped: {item}")
    return "\n".join(lines)


def numbers(report: RunReport) -> dict[str, Any]:
    """What the page shows, as JSON (report/numbers.json)."""
    return {
        "run_dir": report.run_dir, "made_at": report.made_at, "window": list(report.window), "since_s": report.since_s,
        "finished": report.finished.to_json(),
        "turn_latency_s": asdict(report.turn_latency) if report.turn_latency else None,
        "reward_by_policy_version": [{"version": g.key, "count": g.count, "mean": g.mean, "std": g.std} for g in report.reward_by_version],
        "reward_by_data_source": [{"data_source": g.key, "count": g.count, "mean": g.mean, "std": g.std} for g in report.reward_by_source],
        "pass_at_k": [{"data_source": p.data_source, "groups": p.groups, "at_k": {str(k): v for k, v in p.at_k.items()}} for p in report.pass_at_k],
        "tools": [{"name": t.name, "calls": t.calls, "errors": t.errors, "latency_s": asdict(t.latency) if t.latency else None} for t in report.tools],
        "backends": [{**asdict(b), "latency": asdict(b.latency) if b.latency else None} for b in report.backends],
        "down_periods": [asdict(d) for d in report.down],
        "version_changes": [asdict(c) for c in report.version_changes],
        "stage_executions": len(report.intervals), "slots": len(report.intervals.lanes),
        "shards_read": report.shards_read, "event_files": report.event_files, "events": report.events,
        "skipped": list(report.skipped), "examples": report.examples,
    }
