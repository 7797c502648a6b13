"""`--since 1h`: a duration in seconds from what people type (90s, 30m, 1h30m, 2d, or plain seconds)."""

from __future__ import annotations

import re

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float:
    """Seconds in `text`; ValueError naming the accepted forms."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        parts = _PART.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise ValueError(f"duration {text!r} not understood: use e.g. 90s, 30m, 1h, 1h30m, 2d or seconds") from None
        seconds = sum(float(n) * UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be positive")
    return seconds
