"""`hpc-rollout adapt`: keep the right number of node workers on a run, within --min/--max.

A small loop that can run anywhere sbatch works (a login node, or its own tiny Slurm job).
Every `interval_s` it reads the shared queues' depth from the spool and the state of the
tasks it launched from squeue, decides (orchestrator/slurm/scaling.py), and either submits more
node workers through the same launcher as `launch` or withdraws tasks still PENDING
(`scancel --state=PENDING`: a task that started meanwhile is never touched). Workers it
launches carry an idle exit, so they give their nodes back by themselves; the first --min
are launched without one and stay.

One controller per kind of worker (all stages, or eval only) acts at a time: it holds
`control/adapt-KIND.lease` (a `Lease` of orchestrator/spool/lease.py); others stand by and take
over once it stayed unrenewed for `lease_stale_s` as they saw it. Its state and last decisions are in `control/adapt-KIND.json` for
`status`. The controller holds no job state: killing it loses nothing, workers keep working.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import orjson

from orchestrator.spool import fsops
from orchestrator.spool.batches import count_jobs
from orchestrator.spool.jobs import Stage
from orchestrator.spool.launches import new_launch_id
from orchestrator.spool.lease import Lease, Sightings, holder_alive, new_holder
from orchestrator.spool.paths import SpoolPaths
from orchestrator.slurm.scaling import Action, Bounds, Decision, Observation, decide
from orchestrator.slurm.errors import SlurmError, SlurmUnavailable
from orchestrator.slurm.launcher import RECORD_NAME, launch
from orchestrator.slurm.options import LaunchOptions
from orchestrator.slurm.queries import ACTIVE_STATES, TaskState, cancel, queued_tasks
from orchestrator.worker.options import WorkerOptions

log = logging.getLogger(__name__)

DECISIONS_KEPT = 20
LAUNCH_PREFIX = "adapt"
# Workers adapt launches above --min leave after this long idle, unless run.toml sets [workers] idle_exit_s.
IDLE_EXIT_S = 300.0


class AdaptError(SlurmError):
    """adapt cannot manage this kind of worker, or was given impossible bounds."""


def kind_of(stages: frozenset[Stage]) -> str:
    """The kind of worker a controller manages: "all" or "eval" (each has its own lease)."""
    if stages == frozenset(Stage):
        return "all"
    if stages == frozenset({Stage.EVAL}):
        return "eval"
    names = ",".join(sorted(s.value for s in stages))
    raise AdaptError(f"adapt manages workers that claim from shared queues: --stages all or eval, not {names}")


def state_path(paths: SpoolPaths, kind: str) -> Path:
    return paths.control / f"adapt-{kind}.json"


def lease_path(paths: SpoolPaths, kind: str) -> Path:
    return paths.control / f"adapt-{kind}.lease"


@dataclass(frozen=True)
class AdaptSettings:
    bounds: Bounds
    idle_exit_s: float = IDLE_EXIT_S   # of the workers above --min
    interval_s: float = 10.0      # between two looks at the queues
    lease_stale_s: float = 60.0   # a controller silent this long is replaced by a standby


@dataclass(frozen=True)
class LaunchedArray:
    job_id: str
    keep: bool                   # launched without idle exit (part of --min)


class Controller:
    def __init__(self, run_dir: str | os.PathLike[str], settings: AdaptSettings, launch_options: LaunchOptions,
                 worker: WorkerOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.paths = SpoolPaths.of(run_dir)
        self.settings = settings
        self.launch_options = launch_options
        self.worker = worker
        self.kind = kind_of(worker.stages)
        self.clock = clock
        self.holder = new_holder()
        self.sightings = Sightings(clock=clock)
        self.lease = Lease(lease_path(self.paths, self.kind), self.holder, settings.lease_stale_s, self.sightings)
        # A stop request is one made after this controller started: another identity of control/stop
        # than the one seen now (never a comparison of its mtime with this node's clock).
        self.stop_seen = fsops.identity(self.paths.stop_request)
        self.arrays: dict[str, list[LaunchedArray]] = {}   # launch dir -> its arrays (records never change)
        self.decisions: deque[dict[str, Any]] = deque(maxlen=DECISIONS_KEPT)
        self.last_change_at: float | None = None
        self.holding = False
        self.launches = 0
        fsops.ensure_dir(self.paths.control)

    # -- the loop ------------------------------------------------------------------------------
    def serve(self, should_stop: Callable[[], bool]) -> None:
        """Tick until `should_stop()` or `hpc-rollout stop`; the lease is released on the way out."""
        try:
            while not should_stop() and not self.run_stopped():
                self.tick()
                deadline = self.clock() + self.settings.interval_s
                while self.clock() < deadline and not should_stop():
                    time.sleep(min(0.2, self.settings.interval_s))
        finally:
            self.lease.release()

    def run_stopped(self) -> bool:
        stopped = fsops.identity(self.paths.stop_request)
        return stopped is not None and stopped != self.stop_seen

    def tick(self) -> Decision | None:
        """One look and at most one action; None while another controller holds the lease."""
        if not self.lease.acquire():
            if self.holding:
                log.warning("adapt: lost the lease %s; standing by", self.lease.path)
            self.holding = False
            return None
        if not self.holding:
            self.holding = True
            self._resume_history()
        try:
            seen, tasks = self.observe()
        except SlurmUnavailable as exc:   # a controller that does not answer: wait, never guess
            self._record_failure(f"squeue did not answer: {exc}")
            return None
        since = None if self.last_change_at is None else self.clock() - self.last_change_at
        decision = decide(self.settings.bounds, seen, since)
        error = ""
        if decision.action is not Action.HOLD:
            if not self.lease.renew():   # taken over while we looked: the new holder decides
                self.holding = False
                return None
            try:
                self._act(decision, tasks)
                self.last_change_at = self.clock()
            except SlurmError as exc:
                error = str(exc)
                log.error("adapt: %s failed: %s", decision.action.value, exc)
        self._record(seen, decision, tasks, error)
        return decision

    # -- looking -------------------------------------------------------------------------------
    def observe(self) -> tuple[Observation, dict[str, tuple[TaskState, bool]]]:
        backlog = 0
        if Stage.INIT in self.worker.stages:
            backlog += count_jobs(fsops.list_names(self.paths.init_queue))
        if Stage.EVAL in self.worker.stages and (self.kind == "eval" or not self._eval_controller_alive()):
            backlog += len(fsops.list_names(self.paths.eval_queue))
        arrays = self._launched()
        keep_of = {a.job_id: a.keep for a in arrays}
        tasks = {task: (state, keep_of.get(task.split("_", 1)[0], False))
                 for task, state in queued_tasks(keep_of).items()}
        running = sum(1 for s, _ in tasks.values() if s.state in ACTIVE_STATES)
        pending = sum(1 for s, _ in tasks.values() if s.state == "PENDING")
        kept = sum(1 for s, keep in tasks.values() if keep and (s.state in ACTIVE_STATES or s.state == "PENDING"))
        return Observation(backlog=backlog, running=running, pending=pending, kept=kept), tasks

    def _eval_controller_alive(self) -> bool:
        """An eval controller on the run scales for the eval queue: full workers leave it to it."""
        return holder_alive(lease_path(self.paths, "eval"), self.settings.lease_stale_s, self.sightings)

    def _launched(self) -> list[LaunchedArray]:
        """Arrays launched by any controller of this kind (their records under logs/adapt-KIND-*)."""
        prefix = f"{LAUNCH_PREFIX}-{self.kind}-"
        for name in fsops.list_names(self.paths.logs):
            if name.startswith(prefix) and name not in self.arrays:
                record = self.paths.logs / name / RECORD_NAME
                try:
                    data = orjson.loads(fsops.read_bytes(record))
                except (OSError, orjson.JSONDecodeError):
                    continue   # still being submitted: counted from the next look on
                keep = name.startswith(f"{prefix}keep-")
                self.arrays[name] = [LaunchedArray(str(a["job_id"]), keep) for a in data.get("arrays", []) if a.get("job_id")]
        return [array for arrays in self.arrays.values() for array in arrays]

    # -- acting --------------------------------------------------------------------------------
    def _act(self, decision: Decision, tasks: dict[str, tuple[TaskState, bool]]) -> None:
        if decision.action is Action.GROW:
            self.launches += 1
            mode = "keep" if decision.keep else "idle"
            launch_id = f"{new_launch_id(f'{LAUNCH_PREFIX}-{self.kind}-{mode}')}-{self.launches}"
            worker = replace(self.worker, launch_id=launch_id, idle_exit_s=0.0 if decision.keep else self.settings.idle_exit_s)
            result = launch(self.paths.root, replace(self.launch_options, nodes=decision.count), worker)
            log.warning("adapt: +%d worker(s) (%s): arrays %s", decision.count, decision.reason, " ".join(result.array_ids))
        elif decision.action is Action.WITHDRAW:
            # Tasks of surge launches only, newest first; PENDING-only so a task that just started is spared.
            pending = sorted((t for t, (s, keep) in tasks.items() if s.state == "PENDING" and not keep),
                             key=_task_order, reverse=True)[:decision.count]
            if pending:
                try:
                    cancel(pending, pending_only=True)
                except SlurmUnavailable as exc:
                    raise SlurmError(f"scancel: {exc}") from exc
                log.warning("adapt: withdrew pending task(s) %s (%s)", " ".join(pending), decision.reason)

    # -- what status shows ---------------------------------------------------------------------
    def _resume_history(self) -> None:
        """A controller taking over keeps the decisions of the one before it, and says it took over."""
        try:
            previous = orjson.loads(fsops.read_bytes(state_path(self.paths, self.kind)))
        except (OSError, orjson.JSONDecodeError):
            previous = {}
        self.decisions.extend(previous.get("decisions", [])[-DECISIONS_KEPT:])
        changes = [float(d.get("t", 0)) for d in self.decisions if d.get("action") in ("grow", "withdraw")]
        if changes:   # the cool-down runs on across a take-over
            self.last_change_at = self.clock() - max(0.0, time.time() - max(changes))
        before = previous.get("holder")
        self.decisions.append({
            "t": round(time.time(), 3), "action": "lead", "count": 0, "target": previous.get("target"),
            "reason": f"took over from {before}" if before and before != self.holder else "holds the lease",
            "holder": self.holder,
        })

    def _record(self, seen: Observation, decision: Decision, tasks: dict[str, tuple[TaskState, bool]], error: str) -> None:
        reasons: dict[str, int] = {}
        for state, _ in tasks.values():
            if state.state == "PENDING":
                reasons[state.reason or "?"] = reasons.get(state.reason or "?", 0) + 1
        if decision.action is not Action.HOLD or error or not self.decisions or self.decisions[-1]["reason"] != decision.reason:
            self.decisions.append({
                "t": round(time.time(), 3), "action": decision.action.value, "count": decision.count,
                "target": decision.target, "reason": decision.reason, "holder": self.holder,
                **({"error": error} if error else {}),
            })
        bounds = self.settings.bounds
        written = {
            "kind": self.kind, "holder": self.holder, "pid": os.getpid(), "host": socket.gethostname(),
            "updated_at": round(time.time(), 3), "interval_s": self.settings.interval_s,
            "min": bounds.minimum, "max": bounds.maximum, "idle_exit_s": self.settings.idle_exit_s,
            "target": decision.target, "backlog": seen.backlog, "running": seen.running,
            "pending": seen.pending, "kept": seen.kept, "pending_reasons": reasons,
            "decisions": list(self.decisions),
        }
        fsops.write_atomic(state_path(self.paths, self.kind), orjson.dumps(written, option=orjson.OPT_INDENT_2), self.paths.tmp)


    def _record_failure(self, error: str) -> None:
        log.error("adapt: %s", error)
        self.decisions.append({"t": round(time.time(), 3), "action": "hold", "count": 0, "target": None,
                               "reason": "no look at Slurm", "holder": self.holder, "error": error})
        try:
            state = orjson.loads(fsops.read_bytes(state_path(self.paths, self.kind)))
        except (OSError, orjson.JSONDecodeError):
            state = {"kind": self.kind, "min": self.settings.bounds.minimum, "max": self.settings.bounds.maximum}
        state.update({"holder": self.holder, "pid": os.getpid(), "updated_at": round(time.time(), 3),
                      "interval_s": self.settings.interval_s, "decisions": list(self.decisions)})
        fsops.write_atomic(state_path(self.paths, self.kind), orjson.dumps(state, option=orjson.OPT_INDENT_2), self.paths.tmp)


def _task_order(task: str) -> tuple[int, int]:
    array, _, index = task.partition("_")
    return (int(array) if array.isdigit() else 0, int(index) if index.isdigit() else 0)


def read_states(paths: SpoolPaths) -> list[dict[str, Any]]:
    """The state files of this run's controllers (one per kind), for `status`."""
    states = []
    for name in sorted(fsops.list_names(paths.control)):
        if name.startswith("adapt-") and name.endswith(".json"):
            try:
                states.append(orjson.loads(fsops.read_bytes(paths.control / name)))
            except (OSError, orjson.JSONDecodeError):
                continue
    return states
