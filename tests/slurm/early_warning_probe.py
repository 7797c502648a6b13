"""Stands in for submitit's `_submit` module in the early-warning test: it says it is running (a
marker file, its first argument), waits while the test sends the warning signal, then prints the
signals recorded before any handler of its own existed."""

import sys
import time
from pathlib import Path

from orchestrator.worker.signals import signals_received_early

Path(sys.argv[1]).write_text("running")
deadline = time.monotonic() + 10
while time.monotonic() < deadline and not signals_received_early():
    time.sleep(0.05)
print(" ".join(str(s) for s in signals_received_early()))
