"""Loopback allocator: unique across processes, never 127.0.0.x, released, stale reclaimed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from orchestrator.sandbox import loopback
from orchestrator.sandbox.procs import ProcessId

REPO = Path(__file__).resolve().parents[2]

ALLOCATOR = textwrap.dedent("""
    import json, sys
    from orchestrator.sandbox import loopback
    from orchestrator.sandbox.procs import ProcessId
    me = ProcessId.current()
    print(json.dumps([loopback.allocate(me, f"p{i}") for i in range(int(sys.argv[1]))]))
""")


def test_concurrent_processes_get_unique_addresses() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", ALLOCATOR, "100"], cwd=REPO,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ))
             for _ in range(4)]
    addresses = [a for p in procs for a in json.loads(p.communicate()[0])]
    assert len(addresses) == 400 and len(set(addresses)) == 400
    assert not any(a.startswith("127.0.") or a.endswith((".0", ".255")) for a in addresses)


def test_release_and_stale_reclaim() -> None:
    me = ProcessId.current()
    mine = loopback.allocate(me, "live")
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = loopback.allocate(ProcessId(dead.pid, 1), "orphan")
    assert set(loopback.leased()) == {mine, stale}
    assert loopback.reclaim_stale() == 1
    assert loopback.leased() == [mine]
    loopback.release(mine)
    loopback.release(mine)  # idempotent
    assert loopback.leased() == []


def test_addresses_bind_side_by_side() -> None:
    import socket

    me = ProcessId.current()
    a, b = loopback.allocate(me, "a"), loopback.allocate(me, "b")
    sockets = []
    try:
        for address in (a, b):
            s = socket.socket()
            s.bind((address, 0))
            sockets.append(s)
    finally:
        for s in sockets:
            s.close()
        loopback.release(a)
        loopback.release(b)


def test_limits_keep_fractional_timeouts_and_reject_nonsense() -> None:
    import pytest

    from orchestrator.sandbox.errors import SandboxConfigError
    from orchestrator.sandbox.limits import Limits

    limits = Limits.parse({"command_timeout_s": 0.5, "memory_mb": "2048"}, wall_clock_s=90.5)
    assert (limits.command_timeout_s, limits.memory_mb, limits.wall_clock_s) == (0.5, 2048, 90.5)
    assert limits.rlimits()["RLIMIT_AS"] == 2048 << 20
    with pytest.raises(SandboxConfigError, match="not a number"):
        Limits.parse({"cpu_seconds": "lots"})


def test_nproc_limit_only_where_the_kernel_counts_per_namespace() -> None:
    from orchestrator.sandbox.limits import nproc_counts_per_namespace

    assert nproc_counts_per_namespace("6.1.0-18-amd64") and nproc_counts_per_namespace("5.14.0-362.el9")
    assert not nproc_counts_per_namespace("4.18.0-513.el8_9.x86_64")
    assert not nproc_counts_per_namespace("5.4.0-150-generic")


def test_release_by_a_late_sweep_spares_the_next_lease() -> None:
    me = ProcessId.current()
    address = loopback.allocate(me, "first")
    loopback.release(address, "first")
    assert loopback.take(address, me, "second")                                # leased again
    loopback.release(address, "first")                                         # a late sweep
    assert loopback.leased() == [address]
    loopback.release(address, "second")
    assert loopback.leased() == []
