"""Staleness without bias: do slow prompts keep their share of the trained samples under weight swaps?

    python -m benchmarks.staleness [--quick] [--groups 48] [--samples 4] [--turns 4] [--factor 4]
                                   [--slow-share 0.5] [--span 1.2] [--in-flight 4]

The setting of benchmarks.partial (one `serve-llm --tiny`, a real local worker with --slots RUN
slots, chat episodes of a fixed number of tokens per turn, a DynamicSampler trainer with lag bound
1 taking every complete group, real weight swaps paced by the server's progress), with two prompt
classes mixed in one stream: fast prompts of --turns turns and slow prompts of --factor times as
many turns (so their episodes last --factor times as long), a --slow-share of the prompts slow,
interleaved evenly. The trainer stops after --groups trained groups, as a trainer stops after its
steps; --in-flight groups are kept submitted. Swaps come one every (slow turns x slots / --span)
generations, so a slow episode lasts about --span swap periods (1.2, as in partial: restart and
continue waste what partial measured) and a fast one --span / --factor. Both staleness modes run
in one invocation, on the same server:

    restart         a job whose first turns are two versions old is cancelled; its prompt is submitted
                    again, as a partial rollout (the default: DynamicSampler's retry_stale_as)
    restart-always  the same, but every try restarts (retry_stale_as=None: the rule before issue 36)
    continue        the job goes on; the trainer masks the tokens of turns older than the bound

How to read it: `submitted` counts the distinct prompts the trainer drew from the stream (a
resubmission is not a new prompt: the data's mix is what training should keep); `trained` counts
the rows in the trainer's batches. The slow share of each, and ratio = trained share / submitted
share: 1 means slow prompts are trained as often as they are asked for. Target: ratio >= 0.9 for
the default. The sampler resubmits a stale group's prompt first in line and draws a new prompt
only for a group it judged otherwise, so every prompt drawn is trained, dropped as failed (none
here, as a rule) or still in flight at the stop. The stop alone (the longest episodes are the ones left in flight, in
both modes: "groups in flight at the stop") can take the ratio down to 1 - in-flight x (1 - s) /
(s x trained groups), s the slow share (0.917 at the defaults, 0.5 with --quick), no lower. A
policy loses slow prompts for good only when they can never finish: then they fill the in-flight
groups, nothing more is trained and the mode stops after --stall-s (marked stalled):
restart-always does once a slow episode outlasts lag + 1 swap periods (try --span 3); the default
restart does not (a prompt restarts once, then goes on as a partial rollout), nor does continue. Restarts
cost tokens instead: wasted_token_share = 1 - trained tokens / sampled tokens, as partial computes
it (here it also counts the work in flight when the trainer stops).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, parse_args, print_table
from benchmarks.partial import LAG, Swapper, prompts, sampled_tokens, sampling, workload
from orchestrator.app.local_launch import start_local_workers
from orchestrator.devserver.local_server import start_server
from orchestrator.devserver.tiny_model import save_perturbed_copy, tiny_model_dir
from orchestrator.submission.submit import SubmitReport
from orchestrator.trainer import DynamicSampler
from orchestrator.trainer.api import Spool
from orchestrator.worker.options import WorkerOptions

# restart: the default (a stale prompt's second try is a partial rollout: DynamicSampler's
# retry_stale_as); restart-always: every try restarts (retry_stale_as=None, the rule before it).
MODES = ("restart", "restart-always", "continue")
STALENESS = {"restart": "restart", "restart-always": "restart", "continue": "continue"}
RETRY_AS = {"restart": "continue", "restart-always": None, "continue": "continue"}
CLASSES = ("fast", "slow")


def prompt_class(prompt_or_row: dict[str, Any]) -> str:
    """fast | slow, from the instance_id the stream gave the prompt (rows carry it)."""
    return str(prompt_or_row.get("instance_id", "")).split("-", 1)[0]


def prompt_stream(turns: int, factor: int, slow_share: float, drawn: Counter[str]) -> Iterator[dict[str, Any]]:
    """Fast and slow prompts, interleaved so that every prefix holds the slow share (rounded down);
    counts each prompt drawn (with groups in flight, the sampler draws one only to submit it)."""
    for n in itertools.count():
        slow = int((n + 1) * slow_share) > int(n * slow_share)
        kind = CLASSES[slow]
        drawn[kind] += 1
        (prompt,) = prompts(1, turns * factor if slow else turns)
        yield {**prompt, "instance_id": f"{kind}-{n}"}


@dataclass(frozen=True)
class CountingSpool(Spool):
    """The run's Spool, counting the groups submitted per prompt class (resubmissions included)."""

    submitted: Counter[str] = field(default_factory=Counter)

    def submit(self, tasks: Iterable[dict[str, Any]], *args: Any, **options: Any) -> SubmitReport:
        listed = list(tasks)
        self.submitted.update(prompt_class(task) for task in listed)
        return super().submit(listed, *args, **options)


def episode_seconds(spool: Spool) -> dict[str, float]:
    """Median seconds from an episode's first request to its last answer, per class (ok rows)."""
    spans: dict[str, list[float]] = {kind: [] for kind in CLASSES}
    for row in spool.reader(columns=("turns", "status", "instance_id")).rows():
        if row["turns"] and row["status"] == "ok":
            last = row["turns"][-1]
            spans[prompt_class(row)].append(last["sent_at"] + last["latency_s"] - row["turns"][0]["sent_at"])
    return {kind: statistics.median(values) if values else float("nan") for kind, values in spans.items()}


def share(counts: Counter[str]) -> float:
    total = counts["fast"] + counts["slow"]
    return counts["slow"] / total if total else float("nan")


def run_mode(base: Path, mode: str, url: str, record: Path, checkpoints: list[Path],
             args: argparse.Namespace) -> dict[str, Any]:
    plain = workload(base, mode, url, args.slots)
    spool = CountingSpool(plain.paths, plain.config)
    _, before = sampled_tokens(record, 0)
    drawn: Counter[str] = Counter()
    trained_rows: Counter[str] = Counter()
    trained_groups: Counter[str] = Counter()
    launch = start_local_workers(spool.paths, 1, WorkerOptions(runtime="local"), verbose=0)
    trained = 0
    stalled = False
    started = time.monotonic()
    try:
        stream = prompt_stream(args.turns, args.factor, args.slow_share, drawn)
        sampler = DynamicSampler(spool, stream, handler="chat", samples=args.samples, informative_groups=1,
                                 drop_zero_variance=False, in_flight=args.in_flight, sampling=sampling(args),
                                 max_policy_lag=LAG, staleness=STALENESS[mode], retry_stale_as=RETRY_AS[mode])
        with Swapper(spool, checkpoints, record, swap_every(args), abort=STALENESS[mode] == "continue") as swapper:
            while sum(trained_groups.values()) < args.groups:
                try:
                    batch = sampler.next_batch(policy_version=swapper.version, timeout_s=args.stall_s)
                except TimeoutError:   # every group in flight keeps going stale: report it, do not hang
                    stalled = True
                    break
                if not batch.groups:
                    break
                trained += int(batch.batch.arrays["response_mask"].sum())
                trained_rows.update(prompt_class(row) for group in batch.groups for row in group)
                trained_groups.update(prompt_class(group[0]) for group in batch.groups)
        sampler.close(cancel=True)
    finally:
        launch.terminate(timeout_s=60)
    wall = time.monotonic() - started
    sampled, _ = sampled_tokens(record, before)
    submitted_share, trained_share = share(drawn), share(trained_rows)
    return {
        "mode": mode, "drawn": {k: drawn[k] for k in CLASSES},
        "resubmitted": {k: spool.submitted[k] - drawn[k] for k in CLASSES},
        # Drawn and not trained: a failed group (dropped, not resubmitted; none as a rule) counts here too.
        "in_flight_at_stop": {k: drawn[k] - trained_groups[k] for k in CLASSES},
        "failed_groups": sampler.totals.failed_groups,
        "trained_rows": {k: trained_rows[k] for k in CLASSES}, "groups": sum(trained_groups.values()),
        "sampled": sampled, "trained": trained,
        "submitted_share": submitted_share, "submissions_share": share(spool.submitted), "trained_share": trained_share,
        "ratio": trained_share / submitted_share if submitted_share else float("nan"),
        "wasted_share": 1.0 - trained / sampled if sampled else 0.0,
        "stale_groups": sampler.totals.stale_groups, "stale_turn_tokens": sampler.totals.stale_turn_tokens,
        "swaps": swapper.version, "swap_every_s": swapper.period_s(), "episode_s": episode_seconds(spool),
        "stalled": stalled, "wall_s": wall,
    }


def swap_every(args: argparse.Namespace) -> int:
    """Generations between swaps: a slow episode (its turns, one generation each, on `slots` slots
    taking turns) lasts about --span swap periods."""
    return max(1, round(args.turns * args.factor * args.slots / args.span))


# Its smoke test also checks the figures' relations (shares in [0, 1], ratio = trained / submitted).
SMOKE_TESTED_IN = "tests/trainer/test_staleness_benchmark.py"
QUICK = {"groups": 8, "samples": 2, "turns": 2, "slots": 4, "in_flight": 4, "stall_s": 45.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=48, help="groups trained before the trainer stops")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4, help="turns of a fast episode")
    parser.add_argument("--factor", type=int, default=4, help="a slow episode's turns / a fast one's")
    parser.add_argument("--slow-share", type=float, default=0.5, help="share of the prompts that are slow")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per turn")
    parser.add_argument("--slots", type=int, default=8, help="RUN slots of the worker")
    parser.add_argument("--in-flight", type=int, default=4, help="groups the trainer keeps submitted")
    parser.add_argument("--span", type=float, default=1.2, help="slow episode duration / swap period (about)")
    parser.add_argument("--stall-s", type=float, default=120.0, help="a mode training nothing this long stops")
    args = parse_args(parser, QUICK)
    if not 0.0 < args.slow_share < 1.0:
        parser.error("--slow-share must be in (0, 1)")
    load_before = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="bench-staleness-"))
    record = base / "record.jsonl"
    server = start_server(tiny=True, record=record)
    try:
        checkpoints = [save_perturbed_copy(tiny_model_dir(), base / f"ckpt-{i}", i, scale=0.01) for i in range(2)]
        results = {mode: run_mode(base, mode, server.url, record, checkpoints, args) for mode in MODES}
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    load_after = os.getloadavg()
    print(f"fast episodes of {args.turns} turns, slow of {args.turns * args.factor}, x {args.tokens} tokens; "
          f"{args.slow_share:.0%} slow; {args.groups} groups x {args.samples} samples trained, {args.in_flight} "
          f"in flight, {args.slots} RUN slots, lag bound {LAG}, a swap every {swap_every(args)} generations; "
          f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}")

    def both(key: str, kind: str | None = None) -> list[Any]:
        return [results[m][key] if kind is None else results[m][key][kind] for m in MODES]

    print_table("fast and slow prompts: restart (the default), restart at every try, continue", ["figure", *MODES], [
        ["slow share of submitted prompts", *both("submitted_share")],
        ["slow share of trained samples", *both("trained_share")],
        ["ratio (trained share / submitted share)", *both("ratio")],
        ["wasted token share", *both("wasted_share")],
        ["slow share of submissions (resubmissions too)", *both("submissions_share")],
        ["tokens sampled", *both("sampled")],
        ["tokens trained (loss mask 1)", *both("trained")],
        ["prompts submitted, fast", *both("drawn", "fast")],
        ["prompts submitted, slow", *both("drawn", "slow")],
        ["resubmitted as stale, fast", *both("resubmitted", "fast")],
        ["resubmitted as stale, slow", *both("resubmitted", "slow")],
        ["samples trained, fast", *both("trained_rows", "fast")],
        ["samples trained, slow", *both("trained_rows", "slow")],
        ["groups in flight at the stop, fast", *both("in_flight_at_stop", "fast")],
        ["groups in flight at the stop, slow", *both("in_flight_at_stop", "slow")],
        ["groups trained", *both("groups")],
        ["groups failed (dropped)", *both("failed_groups")],
        ["stale-turn tokens masked", *both("stale_turn_tokens")],
        ["weight swaps", *both("swaps")],
        ["swap period s (median)", *both("swap_every_s")],
        ["episode s, fast (median, ok rows)", *both("episode_s", "fast")],
        ["episode s, slow (median, ok rows)", *both("episode_s", "slow")],
        ["stalled (nothing trained for --stall-s)", *both("stalled")],
        ["wall s", *both("wall_s")],
    ])
    restart, always, partial = results["restart"], results["restart-always"], results["continue"]
    verdict = "met" if restart["ratio"] >= 0.9 else "MISSED"
    print(f"\nslow_share_ratio_restart {restart['ratio']:.3f} (the default; target >= 0.9: {verdict}); "
          f"restart at every try {always['ratio']:.3f}; continue {partial['ratio']:.3f}; wasted token share "
          f"{restart['wasted_share']:.3f} / {always['wasted_share']:.3f} / {partial['wasted_share']:.3f}")
    figures: dict[str, Any] = {"load_avg": [round(load_before[0], 2), round(load_after[0], 2)]}
    for name, result in results.items():
        mode = name.replace("-", "_")   # restart_always in the JSON
        figures.update({
            f"slow_submitted_share_{mode}": round(result["submitted_share"], 4),
            f"slow_trained_share_{mode}": round(result["trained_share"], 4),
            f"slow_share_ratio_{mode}": round(result["ratio"], 4),
            f"wasted_token_share_{mode}": round(result["wasted_share"], 4),
            f"swaps_{mode}": result["swaps"],
            f"groups_trained_{mode}": result["groups"],
            f"prompts_submitted_{mode}": result["drawn"],
            f"samples_trained_{mode}": result["trained_rows"],
            f"resubmitted_{mode}": result["resubmitted"],
            f"in_flight_at_stop_{mode}": result["in_flight_at_stop"],
            f"failed_groups_{mode}": result["failed_groups"],
            f"stalled_{mode}": result["stalled"],
            f"wall_s_{mode}": round(result["wall_s"], 1),
        })
    emit_json(figures)


if __name__ == "__main__":
    main()
