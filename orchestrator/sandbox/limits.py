"""Resource limits and how each runtime can enforce them without root or cgroups.

rlimits are set by the execution server on itself (inherited by every tool process, and
an agent cannot raise a hard limit). RLIMIT_NPROC is ignored for processes whose host uid
is root, so for root the process limit also goes through a cgroup (see cgroups.py).

Totals of the sandbox as a whole: `total_memory_mb` is a cgroup's memory.max where one can be
created; without one (a non-root user, no delegated cgroup) the documented fallback holds each
process's address space to the total instead (RLIMIT_AS), which bounds every process but not
their sum. `workspace_mb` is the size of /workspace, a tmpfs of that size (bubblewrap).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from orchestrator.config import DEFAULTS
from orchestrator.sandbox.errors import SandboxConfigError

MiB = 1 << 20

# name: (default, minimum, maximum, unit)
_BOUNDS: dict[str, tuple[float, float, float, str]] = {
    "memory_mb": (4096, 64, 1 << 20, "MiB of address space per process"),
    "total_memory_mb": (8192, 64, 1 << 22, "MiB of memory for the whole sandbox"),
    "workspace_mb": (2048, 1, 1 << 22, "MiB of /workspace"),
    "cpu_seconds": (900, 1, 7 * 86400, "CPU seconds per process"),
    "file_size_mb": (1024, 1, 1 << 22, "MiB per written file"),
    "processes": (256, 8, 100_000, "processes in the sandbox"),
    "open_files": (4096, 64, 20_000, "open files per process"),
    "tmp_mb": (512, 1, 1 << 20, "MiB of private /tmp"),
    "wall_clock_s": (4 * 3600, 1, 30 * 86400, "seconds the sandbox may live"),
    "command_timeout_s": (120, 0.1, 86400, "seconds per tool call, by default"),
}

FLOAT_LIMITS = {"wall_clock_s", "command_timeout_s"}


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 4096
    total_memory_mb: int = DEFAULTS.sandbox.total_memory_mb
    workspace_mb: int = DEFAULTS.sandbox.workspace_mb
    cpu_seconds: int = 900
    file_size_mb: int = 1024
    processes: int = DEFAULTS.sandbox.processes
    open_files: int = 4096
    tmp_mb: int = 512
    wall_clock_s: float = 4 * 3600.0
    command_timeout_s: float = 120.0

    @classmethod
    def parse(cls, value: "Limits | dict[str, Any] | None", **overrides: Any) -> "Limits":
        """Limits from a dict (unknown keys and out-of-range values are errors)."""
        base = value if isinstance(value, Limits) else cls()
        data = dict(value) if isinstance(value, dict) else {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SandboxConfigError(
                f"unknown sandbox limit(s) {unknown}; valid: {', '.join(sorted(known))}"
            )
        checked: dict[str, Any] = {}
        for name, raw in data.items():
            _, low, high, unit = _BOUNDS[name]
            try:
                number = float(raw)
            except (TypeError, ValueError):
                raise SandboxConfigError(f"limit {name}={raw!r} is not a number ({unit})") from None
            if not low <= number <= high:
                raise SandboxConfigError(
                    f"limit {name}={raw!r} is outside [{low:g}, {high:g}] ({unit})"
                )
            checked[name] = number if name in FLOAT_LIMITS else int(number)
        return replace(base, **checked)

    def rlimits(self, memory_cgroup: bool = False) -> dict[str, int]:
        """What the execution server applies to itself (names of the `resource` module).

        Without a memory cgroup no process may exceed the sandbox's total on its own.
        """
        per_process = self.memory_mb if memory_cgroup else min(self.memory_mb, self.total_memory_mb)
        limits = {
            "RLIMIT_AS": per_process * MiB,
            "RLIMIT_CPU": self.cpu_seconds,
            "RLIMIT_FSIZE": self.file_size_mb * MiB,
            "RLIMIT_NOFILE": self.open_files,
            "RLIMIT_CORE": 0,
        }
        if nproc_counts_per_namespace():
            limits["RLIMIT_NPROC"] = self.processes
        return limits


def nproc_counts_per_namespace(release: str | None = None) -> bool:
    """Linux >= 5.14 counts RLIMIT_NPROC per user namespace, i.e. per sandbox.

    Older kernels (RHEL 8 has 4.18) count every process of the user on the node, so a
    per-sandbox value would make forks fail once the user runs many sandboxes: there the
    process limit is left to the pids cgroup, when one is available.
    """
    import os
    import re

    match = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    if match is None:
        return False
    return (int(match.group(1)), int(match.group(2))) >= (5, 14)
