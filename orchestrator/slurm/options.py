"""LaunchOptions: what `launch --nodes N` asks Slurm for, validated once, immutable after."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

from orchestrator.slurm.errors import LaunchError
from orchestrator.slurm.timespec import parse_minutes

# Site conventions differ (USR1, USR2, TERM...): any catchable signal name works.
DEFAULT_SIGNAL = "USR2"
DEFAULT_SIGNAL_DELAY_S = 90
DEFAULT_TIME = "01:00:00"
# Time limits and preemptions both requeue; submitit counts only time-outs against this.
DEFAULT_MAX_REQUEUES = 1000
# Directives launch sets itself: --sbatch must not silently fight them.
RESERVED_SBATCH = frozenset({"array", "output", "error", "signal", "open-mode", "job-name", "wrap"})


def parse_sbatch_pairs(pairs: tuple[str, ...] | list[str]) -> tuple[tuple[str, str], ...]:
    """`--sbatch KEY=VALUE` (or a bare flag KEY) as (key, value) pairs; key without leading dashes."""
    parsed: list[tuple[str, str]] = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().lstrip("-").replace("_", "-")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
            raise LaunchError(f"--sbatch takes KEY=VALUE with a sbatch option name as KEY, got {pair!r}")
        if key in RESERVED_SBATCH:
            raise LaunchError(f"--sbatch {key} is set by launch itself; reserved: {', '.join(sorted(RESERVED_SBATCH))}")
        if "\n" in value:
            raise LaunchError(f"--sbatch {key}: value must be one line")
        parsed.append((key, value if sep else ""))
    return tuple(parsed)


def check_signal(name: str) -> str:
    bare = name.upper().removeprefix("SIG")
    if bare in ("KILL", "STOP") or not hasattr(signal, "SIG" + bare):
        valid = "USR1, USR2, TERM, INT, HUP, CONT, URG"
        raise LaunchError(f"unknown or uncatchable warning signal {name!r}; e.g. {valid}")
    return bare


@dataclass(frozen=True)
class LaunchOptions:
    nodes: int
    partition: str | None = None
    time: str = DEFAULT_TIME
    account: str | None = None
    qos: str | None = None
    cpus_per_node: int | None = None
    mem: str | None = None
    gpus_per_node: int | None = None
    array_parallelism: int | None = None
    exclusive: bool = True            # one node worker per node: it owns the node's sandboxes
    setup: tuple[str, ...] = ()
    sbatch: tuple[tuple[str, str], ...] = ()
    python: str | None = None         # e.g. "apptainer exec img.sif python"; default this Python
    signal: str = DEFAULT_SIGNAL
    signal_delay_s: int = DEFAULT_SIGNAL_DELAY_S
    max_requeues: int = DEFAULT_MAX_REQUEUES
    job_name: str = "hpc-rollout"
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise LaunchError(f"--nodes must be at least 1, got {self.nodes}")
        if self.array_parallelism is not None and self.array_parallelism < 1:
            raise LaunchError(f"--array-parallelism must be at least 1, got {self.array_parallelism}")
        try:
            parse_minutes(self.time)
        except ValueError as exc:
            raise LaunchError(f"--time: {exc}") from None
        object.__setattr__(self, "signal", check_signal(self.signal))
        for line in self.setup:
            if "\n" in line:
                raise LaunchError("--setup takes one shell line per option (repeat --setup)")

    @property
    def time_min(self) -> int:
        return parse_minutes(self.time)
