"""Start one sandbox: runtime dir, lease, cgroup, process, handshake, record.

The runtime process is created in the calling thread (the worker's event loop): bwrap's
--die-with-parent uses PR_SET_PDEATHSIG, which fires when the *thread* that forked it
exits, so it must not be forked from a short-lived executor thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path
import orjson

from orchestrator.spool.paths import SpoolPaths, current_node
from orchestrator.sandbox import cgroups, loopback
from orchestrator.sandbox.errors import SandboxStartError
from orchestrator.sandbox.process import (
    ProcessSandbox, kill_processes, register_child, release_resources, wait_gone,
)
from orchestrator.process_start import start_time
from orchestrator.sandbox.procs import ProcessId
from orchestrator.sandbox.records import SandboxRecord, new_sandbox_dir, remove_sandbox_dir
from orchestrator.sandbox.limits import MiB
from orchestrator.sandbox.runtime import SandboxRuntime
from orchestrator.sandbox.spec import INSIDE_RUN, LaunchSpec
from orchestrator.sandbox.workspace import host_workspace, kept_copy

log = logging.getLogger(__name__)

async def _read_line(fd: int, timeout: float) -> bytes:
    """One line from a pipe without blocking the event loop (no executor threads)."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    buffer = b""
    deadline = loop.time() + timeout
    while b"\n" not in buffer:
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _resolve, ready)
        try:
            await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise TimeoutError from None
        finally:
            loop.remove_reader(fd)
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            continue
        if not chunk:
            break
        buffer += chunk
    return buffer


def _resolve(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


def _log_tail(path: Path, limit: int = 2000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-limit:].strip()


async def launch(runtime: SandboxRuntime, *, job_id: str, paths: SpoolPaths) -> ProcessSandbox:
    """Start the runtime process and wait until its execution server is ready.

    What differs between runtimes (workspace mount, environment, child pid, cgroup) is stated by
    `runtime` (runtime.py); everything else is the same for all of them.
    """
    options = runtime.options
    kind = runtime.name.value
    inside_workspace = runtime.inside_workspace
    owner = ProcessId.current()
    sandbox_id, runtime_dir = new_sandbox_dir()
    address: str | None = None
    groups: cgroups.SandboxGroups | None = None
    workspace: Path | None = options.workspace
    created: Path | None = None
    keep_to = ""
    try:
        if workspace is not None:
            workspace.mkdir(parents=True, exist_ok=True)
        elif runtime.mounts_tmpfs_workspace:
            keep_to = str(kept_copy(paths, job_id, sandbox_id)) if options.keep_workspace else ""
        else:
            workspace = created = host_workspace(paths, job_id, sandbox_id, options.keep_workspace)
            workspace.mkdir(parents=True)
        address = loopback.allocate(owner, sandbox_id)
        if options.cgroup and runtime.confinable:
            groups = cgroups.create(sandbox_id, options.limits.processes, options.limits.total_memory_mb * MiB)
    except BaseException:
        loopback.release(address)
        for group in groups.paths() if groups else []:
            cgroups.remove(group)
        remove_sandbox_dir(runtime_dir)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    status_r = status_w = None
    if runtime.reports_child_pid:
        status_r, status_w = os.pipe()
    spec = LaunchSpec(
        sandbox_id=sandbox_id, job_id=job_id, runtime_dir=runtime_dir,
        socket_dir=runtime_dir / "s", workspace=workspace, options=options,
        loopback=address, status_fd=status_w,
    )
    memory_group = groups.memory if groups is not None and groups.memory != groups.pids else None
    record = SandboxRecord(
        id=sandbox_id, kind=kind, job_id=job_id, node=current_node(),
        runtime_dir=str(runtime_dir), socket=str(spec.socket_dir / "sock"),
        secret=secrets.token_hex(16), owner=owner.to_json(), process=[0, 0], child=None,
        loopback=address, cgroup=str(groups.pids) if groups else None,
        deadline=time.time() + options.limits.wall_clock_s, workspace=str(workspace) if workspace else "",
        memory_cgroup=str(memory_group) if memory_group else None, workspace_keep=keep_to,
        workspace_mb=options.limits.workspace_mb,
    )
    memory_capped = groups is not None and groups.memory is not None
    proc: subprocess.Popen[bytes] | None = None
    try:
        runtime.prepare(spec)
        argv = runtime.argv(spec)
        inside_socket = f"{INSIDE_RUN}/sock" if inside_workspace else record.socket
        config = {
            "secret": record.secret, "socket": inside_socket,
            "cwd": inside_workspace or str(workspace),
            "env": spec.sandbox_env(inside_workspace or str(workspace)),
            "rlimits": options.limits.rlimits(memory_cgroup=memory_capped), "wall_clock_s": options.limits.wall_clock_s,
            "command_timeout_s": options.limits.command_timeout_s,
        }
        procs = cgroups.procs_files(groups)
        with open(runtime_dir / "server.log", "wb") as log_file:
            proc = subprocess.Popen(
                cgroups.joining_argv(procs, argv) if procs else argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file,
                pass_fds=(status_w,) if status_w is not None else (),
                start_new_session=True, cwd=str(workspace or runtime_dir),
                env=dict(os.environ) if runtime.needs_host_env else
                {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
            )
        register_child(proc)
        if status_w is not None:
            os.close(status_w)
            status_w = None
        started = ProcessId(proc.pid, _start_of(proc.pid))
        record = _with(record, process=started.to_json())
        record.save()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(orjson.dumps(config) + b"\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died at once: the read below sees EOF and reports its log
        try:
            line = await _read_line(proc.stdout.fileno(), options.start_timeout_s)
        except TimeoutError:
            raise SandboxStartError(
                f"{kind} sandbox not ready after {options.start_timeout_s} s; "
                f"server log: {_log_tail(runtime_dir / 'server.log') or '(empty)'}"
            ) from None
        if not line.startswith(b"READY"):
            proc.poll()
            raise SandboxStartError(
                f"{kind} sandbox failed to start (exit status {proc.returncode}); command: "
                f"{' '.join(argv[:3])} ...; its output: "
                f"{_log_tail(runtime_dir / 'server.log') or line.decode(errors='replace') or '(none)'}"
            )
        proc.stdout.close()
        if status_r is not None:
            child_pid = _child_pid(status_r)
            if child_pid:
                record = _with(record, child=[child_pid, _start_of(child_pid)])
        record.save()
        return ProcessSandbox(record, popen=proc, status_fd=status_r)
    except BaseException:
        # Covers cancellation too: nothing may outlive a failed start.
        if proc is not None:
            if status_r is not None and record.child is None:
                child_pid = _child_pid(status_r, block=False)
                if child_pid:
                    record = _with(record, child=[child_pid, _start_of(child_pid)])
            kill_processes(record)
            await wait_gone(record.processes(), 5.0)
            proc.poll()
        if status_r is not None:
            os.close(status_r)
        if status_w is not None:
            os.close(status_w)
        release_resources(record)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


def _start_of(pid: int) -> int:
    return start_time(pid) or 0  # 0 never matches: a process already gone counts as dead


def _child_pid(fd: int, block: bool = True) -> int | None:
    """bwrap writes {"child-pid": N} first on --json-status-fd."""
    os.set_blocking(fd, block)
    try:
        data = os.read(fd, 4096)
    except (BlockingIOError, OSError):
        return None
    for line in data.splitlines():
        try:
            info = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(info, dict) and "child-pid" in info:
            return int(info["child-pid"])
    return None


def _with(record: SandboxRecord, **changes: object) -> SandboxRecord:
    from dataclasses import replace

    return replace(record, **changes)  # type: ignore[arg-type]
