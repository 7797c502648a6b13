"""Admission by resource class: which job a worker starts next, and what its sandboxes hold.

In force only where run.toml declares classes or a node budget (RunConfig.classes_in_force);
otherwise the INIT dispatcher claims first come, first served, exactly as before.

What a job holds: its class's memory and CPUs (orchestrator/resource_class.py), from the moment
its INIT starts (the sandbox comes up there) until its RUN ends (the sandbox is closed right
after), or until it leaves this worker before that. The budget is the worker's: run one worker
with INIT and RUN per node (as `launch` does) and it is the node's.

The rule, each time an INIT slot is free:
1. A class is ready when this worker holds one of its jobs (of a claimed batch) or sees one among
   the oldest LOOK_AHEAD entries of queue/init (worker/class_claims.py).
2. It fits when starting one more of its jobs keeps the memory and CPUs in use within the node's
   budget ([node] memory_mb, cpus; 0: not counted) and its jobs here under its `max_jobs`.
3. Among the ready classes that fit, the one with the fewest jobs here per unit of `weight` goes
   first (ties: the oldest job). So a class waiting for its first slot takes the next one that
   frees, short jobs are never queued behind every long one, and a class alone takes every slot
   (no slot is kept idle for a class that has no work).
RUN slots follow the same order: of the jobs prepared here and waiting for one, the oldest of
the class with the fewest RUNs here per weight goes first (`next_to_run`).
A job whose class can never fit (its memory above the whole budget: `submit` refuses such rows,
but the budget may have shrunk since) is started at no cost and fails at once, naming the fix.
Starvation of a large class by a stream of small jobs is bounded by the small class's `max_jobs`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import RunConfig
from orchestrator.resource_class import DEFAULT_CLASS, ResourceClass, never_fits
from orchestrator.spool.jobs import JobSpec


@dataclass(frozen=True)
class Candidate:
    """The oldest job (or queue entry) of one ready class."""

    name: str
    job_class: ResourceClass


@dataclass
class InUse:
    held_memory_mb: int = 0
    held_cpus: int = 0
    peak_memory_mb: int = 0
    jobs: dict[str, int] = field(default_factory=dict)   # by class name


class Admission:
    """One worker's accounting of what its jobs' sandboxes hold, and the rule above."""

    def __init__(self, config: RunConfig, on_admit: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.config = config
        self.memory_mb = config.node.memory_mb
        self.cpus = config.node.cpus
        self.default = config.classes.get(DEFAULT_CLASS) or ResourceClass(
            DEFAULT_CLASS, memory_mb=config.sandbox.total_memory_mb)
        self.in_use = InUse()
        self.held: dict[str, ResourceClass] = {}   # job id -> the class it holds resources of
        self.on_admit = on_admit

    @classmethod
    def of(cls, config: RunConfig, on_admit: Callable[[str, dict[str, Any]], None] | None = None) -> "Admission | None":
        return cls(config, on_admit) if config.classes_in_force else None

    def class_of(self, job: JobSpec) -> ResourceClass:
        """The class a job holds: run.toml's declaration of its name (the run's word wins), else
        the figures its ticket carries (a handler's own class), else the default."""
        carried = job.resource_class
        if not isinstance(carried, dict):
            return self.default
        name = carried.get("name")
        if isinstance(name, str) and name in self.config.classes:
            return self.config.classes[name]
        try:
            return ResourceClass.from_json(carried)
        except ValueError:
            return self.default

    def refusal(self, job_class: ResourceClass) -> str | None:
        """Why no job of this class can ever start here; None: it can."""
        return never_fits(job_class, self.memory_mb, self.cpus)

    def fits(self, job_class: ResourceClass) -> bool:
        if self.refusal(job_class):
            return True   # started at no cost, to fail at once with the reason (JobRunner)
        in_use = self.in_use
        if self.memory_mb and in_use.held_memory_mb + job_class.memory_mb > self.memory_mb:
            return False
        if self.cpus and in_use.held_cpus + job_class.cpus > self.cpus:
            return False
        return not job_class.max_jobs or in_use.jobs.get(job_class.name, 0) < job_class.max_jobs

    def choose(self, ready: Iterable[Candidate]) -> Candidate | None:
        """The candidate to start next by the rule above; None when none fits now."""
        fitting = [c for c in ready if self.fits(c.job_class)]
        if not fitting:
            return None
        return min(fitting, key=lambda c: (self.in_use.jobs.get(c.job_class.name, 0) / c.job_class.weight, c.name))

    def next_to_run(self, prepared: Iterable[str], in_run: Iterable[str]) -> str:
        """Of the jobs prepared here (oldest first; at least one), the one to take the free RUN slot."""
        running: dict[str, int] = {}
        for name in in_run:
            held = self.held.get(name)
            if held is not None:
                running[held.name] = running.get(held.name, 0) + 1
        oldest: dict[str, str] = {}
        for name in prepared:
            held = self.held.get(name, self.default)
            oldest.setdefault(held.name, name)
        weights = {c.name: c.weight for c in self.held.values()}
        return min(oldest.items(), key=lambda item: (running.get(item[0], 0) / weights.get(item[0], 1.0), item[1]))[1]

    def reserve(self, name: str, job_class: ResourceClass) -> None:
        """The job starts INIT here: it holds its class's resources until `release`."""
        if name in self.held or self.refusal(job_class):
            return
        self.held[name] = job_class
        in_use = self.in_use
        in_use.held_memory_mb += job_class.memory_mb
        in_use.held_cpus += job_class.cpus
        in_use.jobs[job_class.name] = in_use.jobs.get(job_class.name, 0) + 1
        in_use.peak_memory_mb = max(in_use.peak_memory_mb, in_use.held_memory_mb)
        if self.on_admit is not None:
            self.on_admit(name, {"class": job_class.name, "memory_mb_in_use": in_use.held_memory_mb,
                                 "cpus_in_use": in_use.held_cpus, "budget_memory_mb": self.memory_mb})

    def release(self, name: str) -> bool:
        """The job's sandbox is closed, or the job left this worker: what it held is free. False when it held nothing."""
        job_class = self.held.pop(name, None)
        if job_class is None:
            return False
        in_use = self.in_use
        in_use.held_memory_mb -= job_class.memory_mb
        in_use.held_cpus -= job_class.cpus
        in_use.jobs[job_class.name] -= 1
        return True

    def report(self) -> dict[str, Any]:
        """For the heartbeat: what is in use now, the peak, the budget."""
        in_use = self.in_use
        return {"memory_mb_in_use": in_use.held_memory_mb, "memory_mb_peak": in_use.peak_memory_mb,
                "memory_mb_budget": self.memory_mb, "cpus_in_use": in_use.held_cpus,
                "jobs_by_class": {k: v for k, v in in_use.jobs.items() if v}}
