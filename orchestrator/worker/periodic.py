"""A periodic duty of the worker as its own asyncio task, charged to its own fsops duty."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Union

from orchestrator.spool import fsops

log = logging.getLogger(__name__)

Period = Union[float, Callable[[], float]]   # seconds, or a function giving the next wait
Duty = Callable[[], Union[None, Awaitable[None]]]


@dataclass(frozen=True)
class PeriodicDuty:
    name: str        # also the fsops duty its metadata operations are charged to
    period: Period
    duty: Duty


def start(duty: PeriodicDuty) -> asyncio.Task[None]:
    """Run the duty every period as a task named after it."""
    async def run() -> None:
        with fsops.duty(duty.name):
            await every(duty.period, duty.duty)
    return asyncio.create_task(run(), name=duty.name.replace("_", "-"))


async def every(period: Period, duty: Duty) -> None:
    """Run `duty` every `period`; a spool error (full, failing) is retried next time, not fatal."""
    failures = 0
    while True:
        wait = period() if callable(period) else period
        await asyncio.sleep(wait)
        try:
            done: Any = duty()
            if asyncio.iscoroutine(done):
                await done
            failures = 0
        except OSError as exc:
            failures += 1
            if failures == 1 or failures % 100 == 0:
                log.warning("%s failed (%d time(s) in a row): %s; retrying every %.1fs",
                            getattr(duty, "__name__", duty), failures, exc, wait)
