"""One agent of `hpc-rollout doctor`:

    python -m orchestrator.doctor.agent MEETING_DIR [--role watcher|maker]

The watcher (Slurm task 0 when no role is given) listens and measures; the maker (task 1)
connects and changes the filesystem. Each prints one JSON line: {"doctor": ROLE, "host": ...,
"results": {...}} (the watcher's results are the measurement; the maker's are empty).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import click

from orchestrator.doctor.channel import connect, listen
from orchestrator.doctor.probes import MAKER, WATCHER, run_all
from orchestrator.doctor.report import filesystem_type


def role_of(given: str | None) -> str:
    if given:
        return given
    task = os.environ.get("SLURM_PROCID")
    if task is None:
        raise click.UsageError("give --role watcher|maker (or run the agents as Slurm tasks 0 and 1)")
    return WATCHER if task == "0" else MAKER


@click.command()
@click.argument("meeting", type=click.Path(path_type=Path))
@click.option("--role", type=click.Choice([WATCHER, MAKER]), default=None)
def main(meeting: Path, role: str | None) -> None:
    role = role_of(role)
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()   # emulated Slurm nodes share a host name
    channel = listen(meeting, host) if role == WATCHER else connect(meeting)
    try:
        channel.step("hello", host=host) if role == MAKER else None
        peer = channel.receive("hello")["host"] if role == WATCHER else None
        results = run_all(role, channel, meeting / "probe")
    finally:
        channel.close()
    print(json.dumps({"doctor": role, "host": host, "peer": peer, "filesystem": filesystem_type(meeting),
                      "results": results}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
