"""Slurm time limits: parse what users type for `--time` into whole minutes.

submitit needs minutes (it computes "has this job timed out" from them), Slurm accepts
"MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM" and "D-HH:MM:SS".
"""

from __future__ import annotations

import math
import re

_DAYS = re.compile(r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$")
_CLOCK = re.compile(r"^(\d+)(?::(\d+))?(?::(\d+))?$")

FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def parse_minutes(text: str | int) -> int:
    """Minutes in a Slurm time limit, rounded up; raises ValueError naming the valid formats."""
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"time limit must be positive, got {text}")
        return text
    value = text.strip()
    seconds: int
    if m := _DAYS.match(value):
        days, hours, minutes, secs = (int(g) if g else 0 for g in m.groups())
        seconds = ((days * 24 + hours) * 60 + minutes) * 60 + secs
    elif m := _CLOCK.match(value):
        parts = [int(g) for g in m.groups() if g is not None]
        if len(parts) == 1:
            seconds = parts[0] * 60
        elif len(parts) == 2:
            seconds = parts[0] * 60 + parts[1]
        else:
            seconds = (parts[0] * 60 + parts[1]) * 60 + parts[2]
    else:
        raise ValueError(f"cannot read time limit {text!r}: use {FORMATS}")
    if seconds <= 0:
        raise ValueError(f"time limit must be positive, got {text!r}")
    return math.ceil(seconds / 60)


def format_minutes(minutes: int) -> str:
    """Minutes as Slurm's D-HH:MM:SS (or HH:MM:SS under a day), as squeue prints limits."""
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    clock = f"{hours:02d}:{mins:02d}:00"
    return f"{days}-{clock}" if days else clock
