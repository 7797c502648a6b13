"""`hpc-rollout demo --task math|code|swe`: one task family end to end on this machine.

The bundled tasks are written into the run directory, the task image is built (or reused),
serve-llm answers as a scripted policy that solves the tasks (`--policy scripted`) or as the
random tiny model (`--policy tiny`: malformed calls, reward 0), local workers run INIT, RUN
(the agent loop in bubblewrap sandboxes) and EVAL, and the rows are summarised.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


from orchestrator.devserver.local_server import start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.app.local_launch import LocalLaunch, start_local_workers
from orchestrator.spool.rundir import init_run
from orchestrator.spool.shard_reader import iter_rows
from orchestrator.submission.submit import submit_file
from orchestrator.worker.options import WorkerOptions

FAMILIES = ("math", "code", "swe")
POLICIES = ("scripted", "tiny")


@dataclass(frozen=True)
class TaskDemoResult:
    run_dir: Path
    family: str
    policy: str
    jobs: int
    rows: list[dict[str, Any]]
    seconds: float


def run_task_demo(
    run_dir: Path, family: str, policy: str, samples: int, workers: int, image: Path | None = None,
    runtime: str = "auto", on_ready: Callable[..., None] | None = None, wait: Callable[..., Any] | None = None,
) -> TaskDemoResult:
    from hpc_rollout.handlers.bundled.image import bundled_image
    from hpc_rollout.handlers.bundled.write import MIRRORS, write_bundled

    if family not in FAMILIES or policy not in POLICIES:
        raise ValueError(f"--task must be one of {', '.join(FAMILIES)} and --policy one of {', '.join(POLICIES)}")
    started = time.monotonic()
    image = image or bundled_image()
    tasks = Path(run_dir).absolute() / "tasks"
    paths, _ = init_run(run_dir, {"shards.idle_flush_s": 0.2, "sandbox.image": str(image), "sandbox.runtime": runtime,
                                  "sandbox.allowed_binds": [str(tasks / MIRRORS)]})   # the SWE rows' repo_mirrors
    bundled = write_bundled(tasks)
    extra = ["--scripted", str(bundled.right), "--max-model-len", "32768"] if policy == "scripted" else []
    server = start_server(tiny=True, extra_args=extra, log_path=paths.logs / "serve-llm.log")
    launch: LocalLaunch | None = None
    try:
        BackendRegistry.of(paths).add(server.url, protocol="vllm", version=0)
        sampling = {"temperature": 1.0, "max_tokens": 512 if policy == "scripted" else 64}
        report = submit_file(paths, bundled.tasks(family), handler=family, samples=samples, sampling=sampling)
        if report.rejected:
            raise RuntimeError(f"bundled {family} tasks rejected: {report.rejected[:3]}")
        launch = start_local_workers(paths, workers, WorkerOptions(), verbose=1, owned=True)
        if on_ready is not None:
            on_ready(paths, server.url, report, launch)
        if wait is not None and wait(paths, launch) is False:
            raise RuntimeError(f"the workers stopped before the jobs finished: see {launch.log_dir}")
    finally:
        if launch is not None:
            launch.terminate(timeout_s=30)
        server.stop()
    rows = [row for _, shard_rows in iter_rows(paths) for row in shard_rows]
    return TaskDemoResult(paths.root, family, policy, report.jobs, rows, time.monotonic() - started)


def task_summary_lines(result: TaskDemoResult) -> list[str]:
    rows = result.rows
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    calls = [c for r in rows for c in (r["tool_calls"] or [])]
    lines = [
        f"{len(rows)} {result.family} trajectories ({result.policy} policy) in {result.seconds:.1f} s: "
        f"mean reward {sum(rewards) / max(len(rewards), 1):.2f}, statuses {dict(Counter(r['status'] for r in rows))}",
        f"stop reasons {dict(Counter(r['stop_reason'] for r in rows))}; {len(calls)} tool calls "
        f"({dict(Counter(c['name'] for c in calls))}), {sum(r['malformed_calls'] or 0 for r in rows)} malformed",
    ]
    if rows:
        sample = max(rows, key=lambda r: len(r["tool_calls"] or []))
        lines.append(f"e.g. job {sample['job_id']} ({sample['instance_id']}, reward {sample['reward']}):")
        for call in (sample["tool_calls"] or [])[:6]:
            arguments = json.loads(call["arguments"])
            shown = json.dumps(arguments)[:90]
            lines.append(f"  turn {call['turn']}: {call['name']} {shown}  -> exit {call['exit_code']}, "
                         f"{call['output_chars']} chars, {call['latency_ms']:.0f} ms")
    return lines
