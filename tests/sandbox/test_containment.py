"""Containment, one behaviour per test, with real bubblewrap."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from orchestrator.spool.paths import SpoolPaths
from orchestrator.sandbox import cgroups
from tests.sandbox.helpers import needs_bwrap, run, started

pytestmark = needs_bwrap


def test_no_network_egress_to_host_loopback_or_outside(spool: SpoolPaths) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()

    async def scenario() -> tuple[str, str]:
        sb = await started(spool)
        try:
            code = (
                "import socket\n"
                "def attempt(addr):\n"
                "    s = socket.socket(); s.settimeout(3)\n"
                "    try:\n"
                "        s.connect(addr); return 'connected'\n"
                "    except OSError as e:\n"
                "        return type(e).__name__ + ':' + str(e.errno)\n"
                f"(attempt(('127.0.0.1', {port})), attempt(('1.1.1.1', 53)))"
            )
            result = await sb.python(code)
            assert result.ok, result
            return eval(result.result or "('', '')")
        finally:
            await sb.close()

    host, outside = run(scenario())
    server.close()
    assert host.startswith("ConnectionRefusedError"), host
    assert outside.endswith(":101"), outside  # ENETUNREACH: no route at all
    assert not accepted


def test_no_write_outside_workspace(spool: SpoolPaths, tmp_path: Path) -> None:
    async def scenario() -> list[object]:
        sb = await started(spool, keep_workspace=True)
        try:
            results = []
            for target in ("/usr/evil", "/etc/evil", "/evil", "/.hpc-rollout/py/server/evil"):
                results.append(await sb.bash(f"touch {target}"))
            results.append(await sb.bash("echo ok > /workspace/inside.txt && echo tmp > /tmp/t && cat /tmp/t"))
            return results
        finally:
            await sb.close()

    *denied, allowed = run(scenario())
    for result in denied:
        assert result.exit_code != 0 and "Read-only file system" in result.output, result
    assert allowed.exit_code == 0 and allowed.output == "tmp\n"
    [workspace] = spool.job_dir("t-000001-000").glob("workspace-kept.*")  # copied out at close
    assert (workspace / "inside.txt").read_text() == "ok\n"
    assert not Path("/usr/evil").exists() and not Path("/evil").exists()


def test_host_processes_invisible(spool: SpoolPaths) -> None:
    async def scenario() -> str:
        sb = await started(spool)
        try:
            return (await sb.bash("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done")).output
        finally:
            await sb.close()

    listing = run(scenario())
    commands = [line for line in listing.splitlines() if line.strip()]
    assert len(commands) < 12, commands          # bwrap init, the server, bash, the loop
    with open("/proc/self/cmdline", "rb") as fh:
        ours = fh.read().replace(b"\0", b" ").decode().strip()
    assert ours not in {line.strip() for line in commands}
    # Only bwrap's own init, the execution server, the shell and the loop itself.
    assert all(line.split()[0].rsplit("/", 1)[-1] in {"bwrap", "python3", "bash", "tr"} for line in commands), commands


def test_host_environment_not_leaked(spool: SpoolPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "424242")
    monkeypatch.setenv("HF_TOKEN", "hf_fake_secret_value")

    async def scenario() -> str:
        sb = await started(spool, env={"TASK_SETTING": "visible"})
        try:
            return (await sb.bash("env")).output
        finally:
            await sb.close()

    env = run(scenario())
    assert "SLURM" not in env and "424242" not in env
    assert "hf_fake_secret_value" not in env and "HF_TOKEN" not in env
    assert "TASK_SETTING=visible" in env and "HOME=/workspace" in env


def test_fork_bomb_is_contained_and_reported(spool: SpoolPaths) -> None:
    async def scenario() -> tuple[object, list[int], str | None]:
        sb = await started(spool, limits={"processes": 48})
        try:
            bomb = await sb.bash(":(){ :|:& };: 2>/dev/null; sleep 3; "
                                 "python3 -c 'import os\nn = 0\ntry:\n  while True:\n"
                                 "    pid = os.fork()\n    if pid == 0: os._exit(0)\n"
                                 "    os.waitpid(pid, 0); n += 1\n"
                                 "    if n > 5: break\nexcept OSError as e: print(\"fork failed:\", e)'",
                                 timeout=30)
            return bomb, cgroups.pids_in(sb.record.cgroup), sb.record.cgroup
        finally:
            await sb.close()

    bomb, inside, group = run(scenario())
    assert bomb.limit == "processes", bomb          # reported as a process-limit hit
    assert "Resource temporarily unavailable" in bomb.output
    if group is not None:                          # root: the pids cgroup held the line
        assert len(inside) <= 48
        assert not Path(group).exists()            # removed on close


def test_memory_hog_is_contained_and_reported(spool: SpoolPaths) -> None:
    async def scenario() -> tuple[object, object, object]:
        sb = await started(spool, limits={"memory_mb": 512})
        try:
            shell = await sb.bash("python3 -c 'x = bytearray(2 << 30)'")
            python = await sb.python("x = bytearray(2 << 30)")
            after = await sb.python("y = 41\ny + 1")
            return shell, python, after
        finally:
            await sb.close()

    shell, python, after = run(scenario())
    assert shell.exit_code == 1 and shell.limit == "memory", shell
    assert python.limit == "memory" and "MemoryError" in (python.error or ""), python
    assert after.result == "42"                    # the interpreter survived


def test_cpu_spinner_is_killed_and_reported(spool: SpoolPaths) -> None:
    async def scenario() -> object:
        sb = await started(spool, limits={"cpu_seconds": 1})
        try:
            return await sb.bash("python3 -c 'while True: pass'", timeout=60)
        finally:
            await sb.close()

    result = run(scenario())
    assert result.signal == "SIGXCPU" and result.limit == "cpu_time", result
    assert result.exit_code == 128 + 24


def test_file_size_and_tmp_size_are_capped(spool: SpoolPaths) -> None:
    async def scenario() -> tuple[object, object]:
        sb = await started(spool, limits={"file_size_mb": 1, "tmp_mb": 4})
        try:
            big = await sb.bash("head -c 2M /dev/zero > big.bin")
            tmp = await sb.bash("for i in 1 2 3 4 5 6; do "
                                "head -c 900K /dev/zero > /tmp/f$i || { echo FULL; break; }; done")
            return big, tmp
        finally:
            await sb.close()

    big, tmp = run(scenario())
    assert big.limit == "file_size" and big.exit_code != 0, big
    assert "FULL" in tmp.output and "No space left on device" in tmp.output, tmp
