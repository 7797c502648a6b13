"""Weight reload of the tiny model: the time `swap_weights` takes, idle and while requests run.

    python -m benchmarks.reload [--swaps 10]

One `serve-llm --tiny`; two checkpoints of its shape alternate. reload_s is the median time of
spool.swap_weights (ask the backend to load the checkpoint over HTTP, wait for it to confirm,
write the new policy version to backends.json). "busy" repeats it while 32 completion
requests are in flight all the time; every request must succeed.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.common import emit_json, median, parse_args, percentile, print_table
from orchestrator.trainer.api import Spool
from orchestrator.devserver.local_server import start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.devserver.tiny_model import save_perturbed_copy, tiny_model_dir


class Load:
    """32 completion requests in flight at all times, from a background thread."""

    def __init__(self, url: str) -> None:
        self.url, self.done, self.failed = url, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        body = {"prompt": [1, 30, 31, 32], "max_tokens": 8, "temperature": 1.0, "logprobs": 0, "return_token_ids": True}
        async with httpx.AsyncClient(timeout=60) as http:
            async def one() -> None:
                while not self.stop.is_set():
                    response = await http.post(f"{self.url}/completions", json=body)
                    if response.status_code == 200:
                        self.done += 1
                    else:
                        self.failed += 1
            await asyncio.gather(*(one() for _ in range(32)))

    def __enter__(self) -> "Load":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(60)


# --quick: the smoke test's size (tests/test_benchmarks.py)
QUICK = {"swaps": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--swaps", type=int, default=10)
    args = parse_args(parser, QUICK)
    base = Path(tempfile.mkdtemp(prefix="bench-reload-"))
    server = start_server(tiny=True)
    try:
        spool = Spool.create(base / "run")
        BackendRegistry(spool.paths).add(server.url, version=0)
        checkpoints = [save_perturbed_copy(tiny_model_dir(), base / f"ckpt-{i}", i, scale=0.01) for i in range(2)]
        idle = [spool.swap_weights(checkpoints[v % 2], version=v + 1).seconds for v in range(args.swaps)]
        with Load(server.url) as load:
            time.sleep(1.0)
            busy = [spool.swap_weights(checkpoints[v % 2], version=args.swaps + v + 1).seconds for v in range(args.swaps)]
        requests, failed = load.done, load.failed
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    print_table("spool.swap_weights on the tiny model (one serve-llm)", ["while", "median s", "p90 s", "max s"],
                [["idle", median(idle), percentile(idle, 0.9), max(idle)],
                 ["32 requests in flight", median(busy), percentile(busy, 0.9), max(busy)]])
    print(f"\nrequests served during the busy swaps: {requests}, failed: {failed}")
    emit_json({"reload_s": round(median(idle), 3), "reload_s_busy": round(median(busy), 3),
               "requests_during_reload": requests, "failed_requests": failed})


if __name__ == "__main__":
    main()
