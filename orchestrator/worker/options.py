"""What one worker process runs: which stages, pool sizes, runtime. Defaults come from run.toml.

Each option is declared once, on its field below (orchestrator/settings_spec.py): the worker's
command line, `launch` and `adapt`, the sbatch templates and `to_args` are generated from it, and
tests/core/test_worker_settings.py checks every one reaches the worker from each of them. An option
backed by run.toml takes its type, bounds and help from there and adds only its flag; a number
means the same everywhere (0 slots is 0 slots, as in run.toml), and only an unset option (None: no
flag) takes run.toml's value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import reduce
from typing import Any, Mapping

from orchestrator.config import SETTINGS, RunConfig
from orchestrator.errors import HpcRolloutError
from orchestrator.settings_spec import declarations, declared, declared_by, to_args
from orchestrator.spool.jobs import Stage

ALL_STAGES = frozenset(Stage)


class OptionsError(HpcRolloutError, ValueError):
    """A worker option is invalid."""


def parse_stages(text: str) -> frozenset[Stage]:
    """'init,run,eval' or 'eval' or 'all' -> set of stages; names the valid ones on error."""
    if text.strip() in ("", "all"):
        return ALL_STAGES
    stages = set()
    for part in text.split(","):
        try:
            stages.add(Stage(part.strip().lower()))
        except ValueError:
            raise OptionsError(f"unknown stage {part!r}; valid: init, run, eval (or all)") from None
    if Stage.INIT in stages and Stage.RUN not in stages:
        raise OptionsError("a worker running INIT must also run RUN: INIT prepares jobs for its own node")
    return frozenset(stages)


def show_stages(stages: frozenset[Stage]) -> str:
    """'init,run,eval' (a subset, in flow order): what parse_stages reads back."""
    return ",".join(stage.value for stage in Stage if stage in stages)


def from_run_toml(dotted: str, flag: str, metavar: str | None = None) -> Any:
    """An option for one run.toml setting: run.toml's declaration (type, bounds, choices, help) with a flag;
    unset (None), it takes the run's value."""
    return declared_by(replace(SETTINGS[dotted], flag=flag, run_toml=dotted, metavar=metavar), None)


@dataclass(frozen=True)
class WorkerOptions:
    stages: frozenset[Stage] = declared(ALL_STAGES, flag="--stages", parse=parse_stages, show=show_stages, metavar="STAGES",
                                        help="stages to run: init,run,eval or a subset (with run if init), or all")
    init_pool: int | None = from_run_toml("pools.init", "--init-pool")
    run_pool: int | None = from_run_toml("pools.run", "--run-pool")
    eval_pool: int | None = from_run_toml("pools.eval", "--eval-pool")
    max_prepared: int | None = from_run_toml("pools.max_prepared", "--max-prepared")
    max_sandboxes: int | None = from_run_toml("pools.max_sandboxes", "--max-sandboxes")
    runtime: str | None = from_run_toml("sandbox.runtime", "--runtime")
    idle_exit_s: float | None = from_run_toml("workers.idle_exit_s", "--idle-exit", metavar="SECONDS")
    launch_id: str = declared("", flag="--launch-id", by_launcher=True,
                              help="the launch this worker belongs to (set by `hpc-rollout launch`)")
    worker_id: str | None = declared(None, flag="--worker-id", by_launcher=True,
                                     help="worker id (default: NODE-PID-RANDOM)")
    launcher_pid: int | None = declared(None, flag="--launcher-pid", kind=int, low=1, by_launcher=True,
                                        help="the launcher waiting on this worker (set by `launch --wait`): once it "
                                             "is gone, leave as soon as nothing is left to claim")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "WorkerOptions":
        """The options among a command's parsed parameters (each named after its field); absent ones keep
        their defaults."""
        return cls(**{name: params[name] for name in declarations(cls) if name in params})

    def resolve(self, config: RunConfig) -> "WorkerOptions":
        """Fill every None from run.toml, so the rest of the worker sees plain values."""
        from_config: dict[str, Any] = {name: reduce(getattr, spec.run_toml.split("."), config)
                                       for name, spec in declarations(WorkerOptions).items()
                                       if spec.run_toml and getattr(self, name) is None}
        return replace(self, **from_config)

    def pool_size(self, stage: Stage) -> int:
        if stage not in self.stages:
            return 0
        size = {Stage.INIT: self.init_pool, Stage.RUN: self.run_pool, Stage.EVAL: self.eval_pool}[stage]
        return int(size or 0)

    def to_args(self) -> list[str]:
        """Command-line arguments of `python -m orchestrator.worker` that reproduce these options."""
        return to_args(self)


@dataclass(frozen=True)
class PoolVerdict:
    """Whether workers with these pools can finish a job: `refusal` when they never can (the
    command stops, saying why), `warning` when that needs other workers too (it names them)."""

    refusal: str | None = None
    warning: str | None = None


def pool_verdict(options: WorkerOptions) -> PoolVerdict:
    """The verdict on resolved options (every pool a number): a job needs INIT and RUN on one node,
    then EVAL anywhere."""
    sizes = f"init = {options.pool_size(Stage.INIT)}, run = {options.pool_size(Stage.RUN)}, " \
            f"eval = {options.pool_size(Stage.EVAL)}"
    served = {stage for stage in Stage if options.pool_size(stage) > 0}
    if not served:
        return PoolVerdict(refusal=(
            f"these workers would claim nothing (stages {','.join(sorted(s.value for s in options.stages))}; {sizes}): "
            f"give the stages they run slots with run.toml [pools] or --init-pool/--run-pool/--eval-pool above 0"))
    if Stage.INIT in served and Stage.RUN not in served:
        return PoolVerdict(refusal=(
            f"run = 0 ({sizes}): INIT prepares jobs for RUN on its own node, so nothing these workers prepare "
            f"would ever run; give RUN slots (run.toml [pools] run, or --run-pool)"))
    if Stage.RUN in served and Stage.INIT in options.stages and Stage.INIT not in served:
        return PoolVerdict(refusal=(
            f"init = 0 ({sizes}): RUN takes only jobs INIT prepared on the same node, and these workers prepare none; "
            f"give INIT slots (run.toml [pools] init, or --init-pool), or leave INIT out with --stages run,eval"))
    warnings = []
    if Stage.RUN in served and Stage.INIT not in options.stages:
        warnings.append("these workers run only jobs that INIT workers on their own nodes prepare: start workers "
                        "with INIT there as well")
    if Stage.RUN in served and Stage.EVAL not in served:
        warnings.append(f"eval = 0 here ({sizes}): finished RUNs wait in queue/eval until workers with EVAL slots "
                        f"run too, e.g. `hpc-rollout launch RUN_DIR --stages eval --eval-pool 4` (or --nodes N "
                        f"--partition cpu)")
    return PoolVerdict(warning="; ".join(warnings) or None)
