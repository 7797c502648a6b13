"""Running one stage of one job under its time budget, turning every failure into a result."""

from __future__ import annotations

import asyncio
import inspect as pyinspect
import logging
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from orchestrator.errors import HpcRolloutError
from orchestrator.handler_api.context import JobContext
from orchestrator.handler_api.contract import AgentHandler, merge_stage_outputs
from orchestrator.spool.jobs import StageError
from orchestrator.spool.jobs import JobStatus, Stage
from orchestrator.spool.staleness import STALE_KIND, StalePolicy
from orchestrator.worker.full_spool import disk_full_error, fills_the_spool

log = logging.getLogger(__name__)
MAX_ERROR_CHARS = 4000
MAX_TRACEBACK_CHARS = 20_000


@dataclass(frozen=True)
class StageOutcome:
    output: dict[str, Any]
    status: JobStatus | None        # None: the stage succeeded, the job goes on
    error: StageError | None


async def execute_stage(
    handler: AgentHandler,
    ctx: JobContext,
    previous: dict[str, Any],
    budget_s: float,
    cancelled_by_user: Callable[[], bool],
) -> StageOutcome:
    """Run `ctx.stage` of the handler. Raises CancelledError only when the worker itself stops, and
    the handler's own error only when it is the spool's filesystem being full."""
    stage = ctx.stage
    if stage is Stage.INIT:
        call = handler.init(ctx)
    elif stage is Stage.RUN:
        call = handler.run(ctx, previous)
    else:
        call = handler.eval(ctx, previous)
    try:
        output = await asyncio.wait_for(call, timeout=max(budget_s, 0.001))
        if not isinstance(output, dict):
            raise TypeError(f"{type(handler).__name__}.{stage.value}() returned {type(output).__name__}, expected dict")
        _check_storable(handler, stage, output)
        return StageOutcome(output, None, None)
    except asyncio.TimeoutError:
        error = StageError(stage.value, "timeout", f"job time budget used up during {stage.value}")
        return StageOutcome(_hook(handler, ctx, error), JobStatus.TIMEOUT, error)
    except asyncio.CancelledError:
        if not cancelled_by_user():
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # the cancellation is handled here: the job ends `cancelled`
        error = StageError(stage.value, "cancelled", "cancelled on request (hpc-rollout cancel)")
        return StageOutcome(_hook(handler, ctx, error), JobStatus.CANCELLED, error)
    except StalePolicy as exc:  # it sampled with a policy the trainer no longer takes
        error = StageError(stage.value, STALE_KIND, str(exc)[:MAX_ERROR_CHARS])
        return StageOutcome(_hook(handler, ctx, error), JobStatus.CANCELLED, error)
    except Exception as exc:  # a handler bug must end the job, never the worker
        if (spool_full := disk_full_error(exc)) is not None and fills_the_spool(spool_full, ctx.paths.root):
            raise   # the infrastructure's fault, not the job's: the engine gives the job back (full_spool.py)
        where = raise_site(exc, handler)
        error = StageError(stage.value, type(exc).__name__, f"{str(exc)[:MAX_ERROR_CHARS]} (at {where})",
                           "".join(traceback.format_exception(exc))[-MAX_TRACEBACK_CHARS:])
        log.warning("job %s failed in %s: %s", ctx.job.job_id, stage.value, error.as_text(), exc_info=exc)
        return StageOutcome(_hook(handler, ctx, error), JobStatus.FAILED, error)


class UnstorableOutput(HpcRolloutError, TypeError):
    """A stage returned something a ticket (JSON) cannot carry to the next stage."""


def _check_storable(handler: AgentHandler, stage: Stage, output: dict[str, Any]) -> None:
    try:
        orjson.dumps(output)
    except TypeError as exc:  # orjson.JSONEncodeError included (too deep, a set, bytes...)
        raise UnstorableOutput(
            f"{type(handler).__name__}.{stage.value}() returned a value that cannot be stored in the job's "
            f"ticket (JSON): {exc}; return lists, dicts, str, int, float, bool or None"
        ) from None


def raise_site(exc: BaseException, handler: AgentHandler) -> str:
    """Where the handler's own code raised (file:line in function): the innermost frame in the
    handler's directory, else the innermost frame at all (the error came from deeper down)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown place"
    try:
        home = str(Path(pyinspect.getfile(type(handler))).resolve().parent)
    except (TypeError, OSError):
        home = ""
    own = [f for f in frames if home and str(Path(f.filename).resolve()).startswith(home)]
    frame = (own or frames)[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def _hook(handler: AgentHandler, ctx: JobContext, error: StageError) -> dict[str, Any]:
    hook = {
        Stage.INIT: handler.init_exception, Stage.RUN: handler.run_exception, Stage.EVAL: handler.eval_exception,
    }[ctx.stage]
    try:
        result = hook(ctx, error)
        return result if isinstance(result, dict) else {"error": error.as_text()}
    except Exception as exc:
        return {"error": error.as_text(), "hook_error": f"{type(exc).__name__}: {exc}"}


def final_fields(
    handler: AgentHandler | None, ctx: JobContext | None, outputs: dict[str, Any], error: StageError | None
) -> dict[str, Any]:
    """The handler's `final_result`, or a plain merge when the handler itself is unusable."""
    if handler is not None and ctx is not None:
        try:
            merged = handler.final_result(ctx, outputs, error)
            if isinstance(merged, dict):
                return merged
        except Exception as exc:
            log.warning("final_result of job %s raised %s", ctx.job.job_id, exc)
    return merge_stage_outputs(outputs)
