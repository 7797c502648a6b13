"""Test-only: a process whose wall clock runs HPC_ROLLOUT_TEST_CLOCK_OFFSET_S seconds off.

Put this directory first on PYTHONPATH of a child process (tests/faults/test_clock_skew.py):
Python imports `sitecustomize` at start-up, before any project code, so the project needs no
hook of its own and the same test runs against any version of it. Only the wall clock moves
(time.time, time.time_ns): monotonic clocks and the kernel's file times stay true, as on a node
whose NTP is off.
"""

import os
import time

_offset_s = float(os.environ.get("HPC_ROLLOUT_TEST_CLOCK_OFFSET_S") or 0.0)
if _offset_s:
    _real_time, _real_time_ns = time.time, time.time_ns
    time.time = lambda: _real_time() + _offset_s
    time.time_ns = lambda: _real_time_ns() + int(_offset_s * 1e9)
