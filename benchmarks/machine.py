"""How busy the machine was with other people's work while a benchmark ran.

The 1-minute load average is what `uptime` shows and what the record notes, but it cannot judge a
benchmark: it counts the benchmark's own processes (4 workers make a load of 4 on an otherwise
idle machine) and, for a minute after, the previous benchmark's. What slows a benchmark down is
CPU time given to others, so that is measured instead: the CPU time every CPU spent busy while the
benchmark ran (/proc/stat, the hypervisor's steal included: a vCPU taken away is a core lost too)
minus the CPU time of the benchmark's own processes (resource usage of the children this process
reaped). Divided by the wall time it is the number of cores others used, on average.

For the children's usage to include every descendant, the runner is a child subreaper
(`become_subreaper`): a worker or a tmux server whose parent exits is re-parented to it instead of
to init, and `reap_orphans` collects it, so its CPU time is counted as the benchmark's, not as
someone else's.
"""

from __future__ import annotations

import ctypes
import os
import resource
import time
from dataclasses import dataclass

PR_SET_CHILD_SUBREAPER = 36   # prctl(2)
# /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice (USER_HZ
# ticks); busy = all but idle and iowait (guest time is already inside user).
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class Sample:
    """What the machine and this process's children had used by `at` (monotonic seconds)."""

    at: float
    busy_s: float | None   # CPU seconds every CPU spent busy since boot; None without /proc/stat
    ours_s: float          # CPU seconds of this process and the children it reaped
    load_1min: float


def cpus() -> int:
    """The CPUs this process may run on (a container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_busy_s() -> float | None:
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()[1:]
    except OSError:
        return None
    return sum(int(fields[i]) for i in BUSY_FIELDS if i < len(fields)) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def sample() -> Sample:
    return Sample(time.monotonic(), machine_busy_s(), own_cpu_s(), os.getloadavg()[0])


def others_cores(before: Sample, after: Sample) -> float | None:
    """Cores used by others on average between the two samples (None: not measurable here)."""
    elapsed = after.at - before.at
    if before.busy_s is None or after.busy_s is None or elapsed <= 0:
        return None
    theirs = (after.busy_s - before.busy_s) - (after.ours_s - before.ours_s)
    return max(0.0, theirs / elapsed)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans() -> int:
    """Collect the descendants that ended after their parent did; how many were collected.
    Call it only while no child of this process is being waited for elsewhere (a thread's
    subprocess.run would lose its child's exit status)."""
    reaped = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1
