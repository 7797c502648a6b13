"""Helpers shared by the sandbox tests."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any, Awaitable, TypeVar

import pytest

from orchestrator.spool.paths import SpoolPaths

T = TypeVar("T")

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None,
    reason="bubblewrap is not installed (apt-get install bubblewrap); scripts/test.sh installs it",
)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def sandbox_processes(base: Path) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose command line mentions `base` (our runtime dir)."""
    found = []
    needle = str(base).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != b"Z":
            found.append((int(entry), cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]))
    return found


async def started(spool: SpoolPaths, job_id: str = "t-000001-000", **options: Any) -> Any:
    from orchestrator.sandbox.start import start_sandbox

    return await start_sandbox("bwrap", job_id=job_id, paths=spool, **options)


def with_sandbox(spool: SpoolPaths, body: Any, **options: Any) -> Any:
    """Run `await body(sandbox)` in a fresh bwrap sandbox that is closed afterwards."""
    async def scenario() -> Any:
        sb = await started(spool, **options)
        try:
            return await body(sb)
        finally:
            await sb.close()

    return run(scenario())
