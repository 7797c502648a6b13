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

from dataclasses import dataclass, replace
from typing import Any

from orchestrator.config import DEFAULTS, SETTINGS
from orchestrator.sandbox.errors import SandboxConfigError
from orchestrator.settings_spec import Family, Numbers, checked, setting

MiB = 1 << 20
# Numbers as text too ("4096"), whole ones truncated: what limits always took.
LIMITS = Family("sandbox limit", "limit {key}", SandboxConfigError, Numbers.TEXT, show_help=True,
                out_of_range="{name}={value!r} is outside [{low}, {high}]{about}",
                not_a_number="{name}={value!r} is not a number{about}")


def _run_toml(key: str) -> tuple[float, float]:
    """The bounds of a limit that run.toml's [sandbox] also sets: one declaration, there."""
    spec = SETTINGS[f"sandbox.{key}"]
    assert spec.low is not None and spec.high is not None
    return spec.low, spec.high


@dataclass(frozen=True)
class Limits:
    memory_mb: int = setting(4096, "MiB of address space per process", bounds=(64, 1 << 20))
    total_memory_mb: int = setting(DEFAULTS.sandbox.total_memory_mb, "MiB of memory for the whole sandbox",
                                   bounds=_run_toml("total_memory_mb"))
    workspace_mb: int = setting(DEFAULTS.sandbox.workspace_mb, "MiB of /workspace", bounds=_run_toml("workspace_mb"))
    cpu_seconds: int = setting(900, "CPU seconds per process", bounds=(1, 7 * 86400))
    file_size_mb: int = setting(1024, "MiB per written file", bounds=(1, 1 << 22))
    processes: int = setting(DEFAULTS.sandbox.processes, "processes in the sandbox", bounds=_run_toml("processes"))
    open_files: int = setting(4096, "open files per process", bounds=(64, 20_000))
    tmp_mb: int = setting(512, "MiB of private /tmp", bounds=(1, 1 << 20))
    wall_clock_s: float = setting(4 * 3600.0, "seconds the sandbox may live", bounds=(1, 30 * 86400))
    command_timeout_s: float = setting(120.0, "seconds per tool call, by default", bounds=(0.1, 86400))

    @classmethod
    def parse(cls, value: "Limits | dict[str, Any] | None", **overrides: Any) -> "Limits":
        """Limits from a dict (unknown keys and out-of-range values are errors)."""
        base = value if isinstance(value, Limits) else cls()
        data = dict(value) if isinstance(value, dict) else {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return replace(base, **checked(cls, data, LIMITS))

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
