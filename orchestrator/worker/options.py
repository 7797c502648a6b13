"""What one worker process runs: which stages, pool sizes, runtime. Defaults come from run.toml."""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.config import RunConfig
from orchestrator.errors import HpcRolloutError
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


@dataclass(frozen=True)
class WorkerOptions:
    stages: frozenset[Stage] = ALL_STAGES
    init_pool: int | None = None       # None: take run.toml's [pools]
    run_pool: int | None = None
    eval_pool: int | None = None
    max_prepared: int | None = None
    max_sandboxes: int | None = None
    runtime: str | None = None         # None: run.toml's [sandbox] runtime
    idle_exit_s: float | None = None   # None: run.toml's [workers] idle_exit_s (0: never)
    launch_id: str = ""
    worker_id: str | None = None       # None: <node>-<pid>-<random>
    launcher_pid: int | None = None    # the launcher waiting on this worker: once it is gone, leave when idle

    def resolve(self, config: RunConfig) -> "WorkerOptions":
        """Fill every None from run.toml, so the rest of the worker sees plain values."""
        pools = config.pools
        return replace(
            self,
            init_pool=pools.init if self.init_pool is None else self.init_pool,
            run_pool=pools.run if self.run_pool is None else self.run_pool,
            eval_pool=pools.eval if self.eval_pool is None else self.eval_pool,
            max_prepared=pools.max_prepared if self.max_prepared is None else self.max_prepared,
            max_sandboxes=pools.max_sandboxes if self.max_sandboxes is None else self.max_sandboxes,
            runtime=config.sandbox.runtime if self.runtime is None else self.runtime,
            idle_exit_s=config.workers.idle_exit_s if self.idle_exit_s is None else self.idle_exit_s,
        )

    def pool_size(self, stage: Stage) -> int:
        if stage not in self.stages:
            return 0
        size = {Stage.INIT: self.init_pool, Stage.RUN: self.run_pool, Stage.EVAL: self.eval_pool}[stage]
        return int(size or 0)

    def to_args(self) -> list[str]:
        """Command-line arguments of `python -m orchestrator.worker` that reproduce these options."""
        args = ["--stages", ",".join(sorted(s.value for s in self.stages))]
        for flag, value in (
            ("--init-pool", self.init_pool), ("--run-pool", self.run_pool), ("--eval-pool", self.eval_pool),
            ("--max-prepared", self.max_prepared), ("--max-sandboxes", self.max_sandboxes),
            ("--runtime", self.runtime), ("--idle-exit", self.idle_exit_s),
        ):
            if value is not None:
                args += [flag, str(value)]
        if self.launch_id:
            args += ["--launch-id", self.launch_id]
        if self.launcher_pid is not None:
            args += ["--launcher-pid", str(self.launcher_pid)]
        return args


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
