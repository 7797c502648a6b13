"""A stop request always ends the worker, even when it races with a dispatcher being woken."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchestrator.config import RunConfig
from orchestrator.worker.engine import Stage, Worker
from orchestrator.worker.options import WorkerOptions
from tests.core.util import FAST, make_run


def test_a_stop_that_lands_with_a_wake_up_still_stops_every_dispatcher(tmp_path: Path) -> None:
    """Python 3.11's asyncio.wait_for returns the result instead of raising when a task is
    cancelled just as the awaited event is set: a dispatcher woken and cancelled in the same
    loop step went on claiming, and the worker never finished draining (found by
    tests/trainer/test_dapo.py: a worker alive 180 s after SIGTERM)."""
    paths = make_run(tmp_path / "run", **FAST)
    worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions(runtime="local"))

    async def main() -> int:
        serving = asyncio.create_task(worker.serve())
        await asyncio.sleep(1.0)            # every dispatcher finds its queue empty and waits
        assert not serving.done()
        for stage in Stage:
            worker.state.pools.wake[stage].set()        # work arrives ...
        worker.request_stop()               # ... in the same loop step as the stop
        return await asyncio.wait_for(serving, timeout=60)

    assert asyncio.run(main()) == 0
