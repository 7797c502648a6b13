"""Task admission: every task's golden solution must score 1 and a no-op must score 0.

Each task is graded twice by its handler's own EVAL (in fresh sandboxes where the handler
uses them), from the RUN results the handler's `reference_result(task, "golden" | "noop")`
builds. A task whose golden solution fails is broken (wrong tests, a patch that does not
apply); one whose no-op passes is trivial (it teaches nothing). Tasks run in parallel.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from orchestrator.handler_api.context import JobContext, WorkerServices
from orchestrator.handler_api.contract import AgentHandler, check_instance, load_handler
from orchestrator.sandbox.policy import SandboxPolicy
from orchestrator.spool.jobs import JobSpec, Stage
from orchestrator.spool.paths import SpoolPaths, current_node
from orchestrator.submission.submit import RowProblem, parse_task, read_rows

CHECKS = (("golden", 1.0), ("noop", 0.0))


@dataclass
class TaskCheck:
    line: int
    instance_id: str
    scores: dict[str, float | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "instance_id": self.instance_id, "ok": self.ok, "scores": self.scores,
                "problems": self.problems, "seconds": round(self.seconds, 3)}


def _context(handler: AgentHandler, services: WorkerServices, instance: dict[str, Any], job_id: str) -> JobContext:
    job = JobSpec(job_id=job_id, group_id=job_id, instance_id=job_id, sample_index=0,
                  handler=handler.name, instance=instance)
    return JobContext(job=job, stage=Stage.EVAL, attempt=1, services=services)


async def _check_one(handler: AgentHandler, services: WorkerServices, line: int, instance: dict[str, Any],
                     instance_id: str) -> TaskCheck:
    check = TaskCheck(line, instance_id or f"line-{line}")
    started = time.monotonic()
    try:
        task = handler.task(instance) if hasattr(handler, "task") else instance
        references = {which: handler.reference_result(task, which) for which, _ in CHECKS}  # type: ignore[attr-defined]
    except (ValueError, NotImplementedError) as exc:
        check.problems.append(str(exc))
        return check

    async def grade(which: str, wanted: float) -> None:
        ctx = _context(handler, services, instance, f"check-line{line}-{which}")
        try:
            scored = await handler.eval(ctx, references[which])
        except ImportError:
            raise   # a package the grader needs is missing: true of every task, said once by the caller
        except Exception as exc:  # a task that crashes its grader is broken
            check.scores[which] = None
            check.problems.append(f"{which}: grading failed: {type(exc).__name__}: {exc}")
            return
        reward = scored.get("reward")
        check.scores[which] = reward
        if reward != wanted:
            detail = {k: v for k, v in scored.items() if k != "reward"}
            verdict = "golden solution does not score 1 (broken task)" if which == "golden" \
                else "no-op scores above 0 (trivial task)"
            check.problems.append(f"{which}: {verdict}: reward {reward}; {str(detail)[:300]}")

    await asyncio.gather(*(grade(which, wanted) for which, wanted in CHECKS))
    check.seconds = time.monotonic() - started
    return check


async def check_tasks(
    path: Path, handler_name: str, *, runtime: str = "auto", sandbox_defaults: dict[str, Any] | None = None,
    sandbox_policy: SandboxPolicy | None = None, parallel: int = 4, on_done: Callable[[TaskCheck], None] | None = None, work_dir: Path | None = None,
) -> list[TaskCheck]:
    """Check every task of `path` with handler `handler_name`; results in file order."""
    handler = load_handler(handler_name)
    if not hasattr(handler, "reference_result"):
        raise ValueError(f"handler {handler_name!r} cannot be checked: it has no golden/no-op solutions "
                         "(ToolAgentHandler.reference_result)")
    scratch = Path(tempfile.mkdtemp(prefix="tasks-check-", dir=work_dir))
    services = WorkerServices(paths=SpoolPaths.of(scratch), worker_id="tasks-check", node=current_node(),
                              runtime=runtime, sandbox_defaults=dict(sandbox_defaults or {}),
                              sandbox_policy=sandbox_policy or SandboxPolicy())
    limit = asyncio.Semaphore(max(1, parallel))
    results: list[TaskCheck] = []

    async def one(line: int, row: Any) -> TaskCheck:
        async with limit:
            if isinstance(row, RowProblem):
                check = TaskCheck(line, f"line-{line}", problems=[row.reason])
            else:
                try:
                    task = parse_task(line, row, handler_name)
                    check_instance(handler, task.instance)
                    services.sandbox_policy.decide(services.sandbox_defaults, handler.sandbox_request(task.instance),
                                                   handler=handler_name)
                except (ValueError, TypeError) as exc:
                    check = TaskCheck(line, f"line-{line}", problems=[f"invalid task: {exc}"])
                else:
                    check = await _check_one(handler, services, line, task.instance, task.instance_id)
        if on_done is not None:
            on_done(check)
        return check

    try:
        results = list(await asyncio.gather(*(one(line, row) for line, row in read_rows(path))))
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return results
