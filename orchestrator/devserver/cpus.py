"""Which CPUs a local LLM server gets, and which are left to the processes that talk to it.

On a GPU cluster the model runs on its GPU and the stage workers have CPUs of their own. On a
small CPU-only machine (2 vCPUs in CI) a server free to use every CPU competes with its own
clients: the stock vLLM's engine core busy-waits and starved them for whole generations, and the
tiny model's thread waited for a CPU behind the workers it serves. Giving the server all CPUs but
the last, and its clients the last, restores the division a cluster has.
"""

from __future__ import annotations

import os


def server_cpus() -> set[int]:
    """All of this process's CPUs but the last, when it has two or more (else the one it has)."""
    cpus = sorted(os.sched_getaffinity(0))
    return set(cpus[:-1]) if len(cpus) > 1 else set(cpus)


def client_cpus() -> set[int]:
    """The CPUs server_cpus() leaves over: the last one (all of them on a one-CPU machine)."""
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[-1]}


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,6' -> {0, 1, 2, 3, 6}; every id must be one this process may use."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list: write ids and ranges, e.g. 0 or 0-3,6")
        cpus.update(range(int(low), int(high or low) + 1))
    usable = os.sched_getaffinity(0)
    if not cpus or not cpus <= usable:
        raise ValueError(f"CPUs {sorted(cpus - usable)} are not among this machine's usable ones {sorted(usable)}")
    return cpus


def confine_to(cpus: set[int]) -> None:
    """Pin the calling process; all it starts afterwards inherits it (as a `preexec_fn`: the child, before exec)."""
    os.sched_setaffinity(0, cpus)
