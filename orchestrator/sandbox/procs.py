"""Process identity by (pid, start time), so that a recycled pid is never mistaken or killed."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from orchestrator.process_start import start_time, stat_fields


def live_members(groups: set[int]) -> list[int]:
    """Pids of the processes in these process groups that have not finished (zombies excluded)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = stat_fields(entry.name)
        if fields is not None and fields[0] != b"Z" and int(fields[2]) in groups:
            members.append(int(entry.name))
    return members


@dataclass(frozen=True)
class ProcessId:
    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> "ProcessId":
        started = start_time(pid)
        if started is None:
            raise ProcessLookupError(f"process {pid} does not exist")
        return cls(pid, started)

    @classmethod
    def current(cls) -> "ProcessId":
        return cls.of(os.getpid())

    def alive(self) -> bool:
        return self.pid > 0 and start_time(self.pid) == self.start

    def kill(self, sig: int = signal.SIGKILL) -> bool:
        """Signal the process if it is still the one recorded; True if a signal was sent."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def to_json(self) -> list[int]:
        return [self.pid, self.start]

    @classmethod
    def from_json(cls, data: list[int] | None) -> "ProcessId | None":
        return None if not data else cls(int(data[0]), int(data[1]))


def wait_gone(processes: list[ProcessId], timeout: float) -> bool:
    """Poll until none of `processes` is alive; reaps our own children on the way."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        for proc in processes:
            try:  # a child of ours stays a zombie until reaped
                os.waitpid(proc.pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if not any(p.alive() for p in processes):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
