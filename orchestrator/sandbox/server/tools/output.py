"""Bounded output capture that keeps the head and the tail of a long stream."""

from __future__ import annotations


class HeadTail:
    """Collects text up to `limit` characters: the first half and the last half are kept.

    Long outputs are usually interesting at both ends (the command echoing its plan at the
    start, the error at the end), so the middle is what gets dropped.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(64, limit)
        self.head_limit = self.limit // 2
        self.tail_limit = self.limit - self.head_limit
        self.head = ""
        self.tail = ""
        self.dropped = 0

    def add(self, text: str) -> None:
        if len(self.head) < self.head_limit:
            room = self.head_limit - len(self.head)
            self.head += text[:room]
            text = text[room:]
        if not text:
            return
        self.tail += text
        if len(self.tail) > self.tail_limit:
            excess = len(self.tail) - self.tail_limit
            self.dropped += excess
            self.tail = self.tail[excess:]

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        if not self.dropped:
            return self.head + self.tail
        return self.head + "\n[... %d characters truncated ...]\n" % self.dropped + self.tail


def describe_exit(code: "int | None", output: str) -> "tuple[str | None, str | None]":
    """(signal name, limit hit) for a shell exit code and its output, when recognisable."""
    import signal as _signal

    sig = None
    if code is not None and code > 128:
        try:
            sig = _signal.Signals(code - 128).name
        except ValueError:
            sig = None
    limit = None
    if sig == "SIGXCPU":
        limit = "cpu_time"
    elif sig == "SIGXFSZ" or "File size limit exceeded" in output or "File too large" in output:
        limit = "file_size"
    elif "MemoryError" in output or "Cannot allocate memory" in output or "out of memory" in output:
        limit = "memory"
    elif "fork" in output and ("Resource temporarily unavailable" in output or "fork: retry" in output):
        limit = "processes"
    return sig, limit
