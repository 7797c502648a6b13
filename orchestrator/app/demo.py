"""The embedded default, end to end on one machine: real chat jobs against a real tiny model.

serve-llm --tiny (a small transformers model built offline) -> registered as the run's backend
-> chat tasks submitted with several samples -> local stage workers -> Parquet shards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from orchestrator.devserver.local_server import start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.app.local_launch import LocalLaunch, start_local_workers
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run
from orchestrator.spool.shard_reader import iter_rows
from orchestrator.submission.submit import submit_rows
from orchestrator.worker.options import WorkerOptions

QUESTIONS = [
    ("What is the capital of France?", "And of Italy?"),
    ("Add 17 and 25.", "Now double it."),
    ("Name a prime number.", "A larger one?"),
    ("Write a haiku about clusters.", "Shorter, please."),
    ("What does a spool directory hold?", "Why files and not a server?"),
    ("Translate 'hello' to French.", "And to German?"),
    ("Give a synonym of fast.", "An antonym?"),
    ("What is 2 to the power 10?", "And 2 to the 11?"),
]


@dataclass(frozen=True)
class DemoResult:
    run_dir: Path
    backend: str
    jobs: int
    rows: list[dict[str, Any]]
    seconds: float            # the whole demo: server start and model load, workers, shutdown
    drain_seconds: float = 0.0   # from the jobs queued to the last row: what the progress bar timed


def demo_tasks(count: int) -> list[dict[str, Any]]:
    tasks = []
    for index in range(count):
        first, follow_up = QUESTIONS[index % len(QUESTIONS)]
        tasks.append({
            "instance_id": f"demo-{index}",
            "messages": [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": first}],
            "user_turns": [follow_up],
        })
    return tasks


def run_demo(
    run_dir: Path, tasks: int, samples: int, workers: int, max_tokens: int,
    on_ready: Any = None, wait: Any = None,
) -> DemoResult:
    """Start the tiny server, run the chat jobs through local workers, stop everything."""
    started = time.monotonic()
    paths, _ = init_run(run_dir, {"shards.idle_flush_s": 0.2})
    server = start_server(tiny=True, log_path=paths.logs / "serve-llm.log")
    launch: LocalLaunch | None = None
    try:
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=0)
        rows = list(enumerate(demo_tasks(tasks), 1))
        report = submit_rows(paths, rows, source="demo", handler="chat", samples=samples,
                             sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": max_tokens})
        launch = start_local_workers(paths, workers, WorkerOptions(), verbose=1, owned=True)
        if on_ready is not None:
            on_ready(paths, server.url, report, launch)
        queued_at = time.monotonic()
        drained = wait(paths, launch) if wait is not None else None
        drain_seconds = time.monotonic() - queued_at
        if drained is False:
            raise RuntimeError(f"the workers stopped before the jobs finished: see {launch.log_dir}")
    finally:
        if launch is not None:
            launch.terminate(timeout_s=30)
        server.stop()
    landed = [row for _, shard_rows in iter_rows(paths) for row in shard_rows]
    return DemoResult(paths.root, server.url, report.jobs, landed, time.monotonic() - started, drain_seconds)


def summary_lines(result: DemoResult) -> list[str]:
    rows = result.rows
    ok = [r for r in rows if r["status"] == "ok"]
    groups: dict[str, list[float]] = {}
    for row in ok:
        groups.setdefault(row["group_id"], []).append(row["reward"] or 0.0)
    turns = sum(len(r["turns"] or []) for r in ok)
    sampled = sum(sum(r["response_mask"] or []) for r in ok)
    lines = [
        f"{len(rows)} trajectories ({len(ok)} ok) in {result.drain_seconds:.1f} s from queued to stored "
        f"({result.seconds:.1f} s with the server's start and the shutdown), {turns} model turns, "
        f"{sampled} sampled tokens",
        f"groups: {len(groups)}, mean reward {sum(sum(v) for v in groups.values()) / max(len(ok), 1):.3f}",
    ]
    if ok:
        sample = ok[0]
        lines.append(
            f"e.g. job {sample['job_id']}: prompt {len(sample['prompt_ids'] or [])} tokens, response "
            f"{len(sample['response_ids'] or [])} tokens ({sum(sample['response_mask'] or [])} sampled), "
            f"{len(sample['turns'] or [])} turns, policy version {sample['policy_version_min']}"
        )
    return lines


def default_run_dir(base: Path) -> Path:
    return base / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"


def paths_hint(paths: SpoolPaths) -> list[str]:
    return [
        f"hpc-rollout status {paths.root}",
        f"hpc-rollout tail {paths.root} --fields job_id,status,reward,policy_version_min",
        f"python -c \"import pyarrow.dataset as ds; print(ds.dataset('{paths.shards}').to_table().num_rows)\"",
    ]
