"""Helpers shared by the engine tests: fast run directories, task files, real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow.dataset as ds

from orchestrator.spool import fsops
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run
from orchestrator.report.status import pending_count

# Short leases and quick shard commits keep crash tests to seconds.
FAST = {
    "leases.heartbeat_s": 0.2, "leases.lease_s": 2.0, "shards.idle_flush_s": 0.1,
    "shards.max_age_s": 1.0, "shutdown.grace_s": 5.0,
}


def make_run(root: Path, **overrides: Any) -> SpoolPaths:
    paths, _ = init_run(root, {**FAST, **overrides})
    return paths


def write_jsonl(path: Path, rows: Iterable[Any]) -> Path:
    with open(path, "w") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def cli(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", *args],
                            capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"hpc-rollout {' '.join(args)} -> {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def start_worker(paths: SpoolPaths, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A real worker process in its own session (so the test can signal it and its group)."""
    log = open(paths.root / f"worker-{time.monotonic_ns()}.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.worker", str(paths.root), "-v", *args],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def stop_worker(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


def wait_until(condition: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_drained(paths: SpoolPaths, timeout: float = 120) -> None:
    wait_until(lambda: pending_count(paths) == 0, timeout, "the queues to drain")


def drain_with_a_worker(paths: SpoolPaths, *args: str, timeout: float = 120) -> None:
    """Start a real worker, wait until nothing is pending, stop it; it must exit 0."""
    worker = start_worker(paths, *args)
    try:
        wait_drained(paths, timeout=timeout)
    finally:
        assert stop_worker(worker) == 0


def serve_in_process(paths: SpoolPaths, timeout: float = 60, **options: Any) -> Any:
    """A worker in this process (so it can use a handler defined by the test) until nothing is pending."""
    import asyncio

    from orchestrator.config import RunConfig
    from orchestrator.worker.engine import Worker
    from orchestrator.worker.options import WorkerOptions

    worker = Worker(paths, RunConfig.load(paths.run_config), WorkerOptions(**options))

    async def main() -> None:
        serving = asyncio.create_task(worker.serve())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not serving.done():
            with fsops.duty("observer"):   # the test's own polls are not the worker's operations
                if not pending_count(paths):
                    break
            await asyncio.sleep(0.05)
        worker.request_stop()
        await serving

    asyncio.run(main())
    return worker


def rows(paths: SpoolPaths) -> list[dict[str, Any]]:
    if not any(paths.shards.glob("*.parquet")):
        return []
    return ds.dataset(paths.shards, format="parquet").to_table().to_pylist()


def refusal_as(user: Any, action: Callable[[], None], error: type[BaseException]) -> str | None:
    """Run `action` in a child process that became `user` (a pwd entry; the interpreter cannot
    run as them here otherwise): the message of the `error` it raised, None when it raised none."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            action()
        except error as exc:
            os.write(write, str(exc).encode())
            code = 3
        finally:
            os._exit(code)
    os.close(write)
    message = os.read(read, 4096).decode()
    os.close(read)
    return message if os.waitpid(pid, 0)[1] >> 8 == 3 else None
