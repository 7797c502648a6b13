"""Durations as people read them, for every text the run's readers print (status, report)."""

from __future__ import annotations


def format_seconds(seconds: float | None) -> str:
    """Durations for people: '-', '0.26 ms', '41 ms', '3.20 s', '2 min 05 s', '3 h 04 min'."""
    if seconds is None or seconds != seconds:
        return "-"
    if seconds < 0.001:
        return f"{seconds * 1000:.2f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest:02d} s"
    hours, rest = divmod(round(seconds) // 60, 60)
    return f"{hours} h {rest:02d} min"
