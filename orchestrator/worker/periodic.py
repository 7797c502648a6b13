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
    wake: asyncio.Event | None = None   # set: run the duty now rather than at the end of the period


def start(duty: PeriodicDuty) -> asyncio.Task[None]:
    """Run the duty every period as a task named after it."""
    async def run() -> None:
        with fsops.duty(duty.name):
            await every(duty.period, duty.duty, duty.wake)
    return asyncio.create_task(run(), name=duty.name.replace("_", "-"))


async def every(period: Period, duty: Duty, wake: asyncio.Event | None = None) -> None:
    """Run `duty` every `period` (or as soon as `wake` is set); a spool error (full, failing) is
    retried next time, not fatal."""
    failures = 0
    while True:
        wait = period() if callable(period) else period
        if wake is None:
            await asyncio.sleep(wait)
        else:
            await wait_or_timeout(wake, wait)
            wake.clear()
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


async def wait_or_timeout(event: asyncio.Event, seconds: float) -> bool:
    """Wait for `event` up to `seconds`; whether it was set. A cancellation always gets through:
    Python 3.11's wait_for swallows one that lands as the event is set, which would leave a task
    that was told to stop running forever (asyncio.timeout tells its own cancellation apart)."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
        return True
    except TimeoutError:
        return event.is_set()
