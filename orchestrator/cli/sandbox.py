"""`hpc-rollout sandbox exec|shell|list|sweep` and `hpc-rollout image build`."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator

import click

from orchestrator.config import RUNTIME_NAMES

RUNTIME_CHOICE = click.Choice(RUNTIME_NAMES)


def _sandbox_options(image: str | None, network: bool, binds: tuple[str, ...], env: tuple[str, ...],
                     memory_mb: int | None, timeout: float | None) -> dict[str, Any]:
    variables: dict[str, str] = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} must look like NAME=VALUE", param_hint="--env")
        variables[name] = value
    options: dict[str, Any] = {"image": image, "network": network, "binds": list(binds), "env": variables}
    limits: dict[str, Any] = {}
    if memory_mb:
        limits["memory_mb"] = memory_mb
    if timeout:
        limits["command_timeout_s"] = timeout
    options["limits"] = limits
    return options


def _common(func: Any) -> Any:
    for decorator in reversed([
        click.option("--runtime", type=RUNTIME_CHOICE, default="auto", show_default=True,
                     help="apptainer if installed, else bubblewrap; local = no isolation."),
        click.option("--image", type=click.Path(exists=True), help="Image (bwrap: a directory; "
                     "apptainer: .sif). Default for bwrap: the host's /usr, read-only."),
        click.option("--network/--no-network", default=False, show_default=True),
        click.option("--bind", "binds", multiple=True, metavar="SRC[:DST[:ro|rw]]"),
        click.option("--env", multiple=True, metavar="NAME=VALUE"),
        click.option("--memory-mb", type=click.IntRange(64), help="Address-space limit per process."),
        click.option("--workspace", type=click.Path(file_okay=False),
                     help="Host directory mounted at /workspace (default: a fresh one, size-capped, gone at exit)."),
    ]):
        func = decorator(func)
    return func


@click.group("sandbox")
def sandbox_group() -> None:
    """Run commands in a sandbox by hand (the same runtimes workers use).

    \b
    Examples:
      hpc-rollout sandbox exec --no-network -- python3 -c 'print(1)'
      hpc-rollout sandbox shell --image images/out/python-versioned-...
      hpc-rollout sandbox list
    """


@sandbox_group.command("exec", context_settings={"ignore_unknown_options": True})
@_common
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds for the command.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_command(runtime: str, image: str | None, network: bool, binds: tuple[str, ...],
                 env: tuple[str, ...], memory_mb: int | None, workspace: str | None,
                 timeout: float, command: tuple[str, ...]) -> None:
    """Run COMMAND in a fresh sandbox and exit with its status.

    \b
    Example:
      hpc-rollout sandbox exec --no-network -- python3 -c 'print(1)'
    """
    import asyncio   # here, not at start-up: every command pays for what the module imports

    options = _sandbox_options(image, network, binds, env, memory_mb, timeout)
    code = asyncio.run(_exec(runtime, options, workspace, shlex.join(command), timeout))
    sys.exit(code)


@sandbox_group.command("shell")
@_common
def shell_command(runtime: str, image: str | None, network: bool, binds: tuple[str, ...],
                  env: tuple[str, ...], memory_mb: int | None, workspace: str | None) -> None:
    """An interactive prompt in a sandbox: each line goes to its persistent bash.

    \b
    Example:
      hpc-rollout sandbox shell --no-network --bind "$PWD:/work:ro"
    """
    import asyncio

    options = _sandbox_options(image, network, binds, env, memory_mb, None)
    asyncio.run(_shell(runtime, options, workspace))


@sandbox_group.command("list")
def list_command() -> None:
    """This node's sandboxes (of this user), from their records in the runtime directory.

    \b
    Example:
      hpc-rollout sandbox list      # id, runtime, state, owner process, time left, job
    """
    import time

    from orchestrator.sandbox.records import SandboxRecord, sandboxes_dir

    rows = []
    for directory in sorted(sandboxes_dir().iterdir()):
        try:
            record = SandboxRecord.load(directory)
        except (OSError, ValueError, TypeError):
            continue
        owner = "alive" if record.owner_process().alive() else "GONE"
        state = "running" if all(p.alive() for p in record.processes()) else "exited"
        left = max(0.0, record.deadline - time.time())
        rows.append(f"{record.id}  {record.kind:<9} {state:<8} owner {record.owner[0]} ({owner})  "
                    f"{record.loopback or '-':<15} {left / 60:7.1f} min left  job {record.job_id}")
    click.echo("\n".join(rows) if rows else f"no sandboxes in {sandboxes_dir()}")


@sandbox_group.command("sweep")
def sweep_command() -> None:
    """Reap this node's sandboxes whose owner process is gone (workers do this themselves).

    \b
    Example:
      hpc-rollout sandbox sweep     # after a worker was killed with SIGKILL
    """
    from orchestrator.sandbox.start import sweep_orphaned_sandboxes

    click.echo(f"reaped {sweep_orphaned_sandboxes()} sandbox(es)")


def register(cli: click.Group) -> None:
    cli.add_command(sandbox_group)
    from orchestrator.cli.image import register_image_commands

    register_image_commands(cli)


@contextlib.asynccontextmanager
async def _open(runtime: str, options: dict[str, Any], workspace: str | None) -> AsyncIterator[Any]:
    """A sandbox with a throw-away workspace (kept when --workspace names one)."""
    from orchestrator.spool.paths import SpoolPaths
    from orchestrator.sandbox.start import start_sandbox

    scratch = Path(tempfile.mkdtemp(prefix="hpc-rollout-cli-"))
    if workspace:
        options = dict(options, workspace=workspace)
    try:
        sandbox = await start_sandbox(runtime, job_id=f"cli-{os.getpid()}", paths=SpoolPaths.of(scratch), **options)
        try:
            yield sandbox
        finally:
            await sandbox.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def _exec(runtime: str, options: dict[str, Any], workspace: str | None, command: str,
                timeout: float) -> int:
    async with _open(runtime, options, workspace) as sandbox:
        result = await sandbox.bash(command, timeout=timeout, max_output=10_000_000)
    click.echo(result.output, nl=False)
    if result.error or result.timed_out or result.limit:
        click.echo(f"[sandbox] {result.error or ''} timed_out={result.timed_out} limit={result.limit}", err=True)
    return result.exit_code if result.exit_code is not None else 125


async def _shell(runtime: str, options: dict[str, Any], workspace: str | None) -> None:
    import asyncio

    async with _open(runtime, options, workspace) as sandbox:
        click.echo(f"sandbox {sandbox.kind} ready (workspace {sandbox.descriptor()['workspace'] or 'in the sandbox'}); "
                   "Ctrl-D to leave", err=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, _prompt)
            if line is None:
                break
            if not line.strip():
                continue
            result = await sandbox.bash(line, timeout=3600)
            click.echo(result.output, nl=False)
            if result.exit_code:
                click.echo(f"[exit {result.exit_code}]", err=True)


def _prompt() -> str | None:
    try:
        return input("sandbox$ ")
    except EOFError:
        return None
