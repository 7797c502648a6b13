"""What every persistent interpreter tool (bash, python) keeps: where and how it runs."""

from __future__ import annotations

import threading
from typing import Callable, Dict, Optional


class InterpreterSession:
    """Working directory, environment, default timeout and the locks shared by both tools."""

    def __init__(
        self, cwd: str, env: Dict[str, str], default_timeout: "Optional[float]", fallback_timeout: float,
        on_start: "Optional[Callable[[], None]]" = None,
    ) -> None:
        self.default_timeout = float(default_timeout or fallback_timeout)
        self.on_start = on_start
        self.cwd = cwd
        self.env = dict(env)
        self.lock = threading.Lock()                  # one command at a time
        self.interrupt_requested = threading.Event()
