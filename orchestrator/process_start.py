"""A process's start time: with its pid, the identity a recycled pid cannot fake.

Below every package (sandboxes, LLM servers' readiness and the stock vLLM launcher all tell their
own processes from a newcomer that got the same pid), so none of them imports another for it.
"""

from __future__ import annotations


def stat_fields(pid: int | str) -> list[bytes] | None:
    """/proc/PID/stat from field 3 (the state) on, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return stat[stat.rindex(b")") + 2:].split()


def start_time(pid: int) -> int | None:
    """The process start time in clock ticks since boot, or None when no such process."""
    fields = stat_fields(pid)
    if fields is None or fields[0] == b"Z":  # a zombie has finished; only its parent's wait() is missing
        return None
    return int(fields[19])
