"""The last line of defence of the command line: one line naming the problem, never a traceback.

Commands turn the errors they expect into click errors themselves; whatever escapes them ends
here. Every expected error derives from HpcRolloutError (orchestrator/errors.py) and carries a
message that names the fix; operating-system errors are described (a full disk says so);
anything else is reported as an internal error, with the traceback available through
HPC_ROLLOUT_TRACEBACK=1. The exit status follows orchestrator/cli/exit_codes.py: 2 for a wrong
command line, 130 for Ctrl-C (and SIGTERM, SIGHUP: cli/stop_signals.py), 1 for the rest.
Messages are printed as they are (click.echo: no markup is read in them).
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Callable, NoReturn

import click

from orchestrator.cli.exit_codes import ExitCode
from orchestrator.errors import HpcRolloutError

TRACEBACK_ENV = "HPC_ROLLOUT_TRACEBACK"


def describe_os_error(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device{where}: free some space (or point the run at another disk) and retry"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied{where}: check the owner and mode of that path"
    if exc.errno == errno.EADDRINUSE:
        return f"address already in use{where}: pick another port"
    return f"{exc.strerror or exc}{where}"


def run_guarded(command: Callable[[], object]) -> None:
    """Run the click command (in click's non-standalone mode); print escaped errors as one line
    and exit with the code of exit_codes.py."""
    try:
        returned = command()
    except click.ClickException as exc:   # bad usage (2) or an error a command raised itself (1)
        exc.show()
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV):
            raise
        _fail(_describe(exc))
    if isinstance(returned, int) and not isinstance(returned, bool) and returned:
        sys.exit(returned)   # click's non-standalone mode returns the code of ctx.exit(N)


def _describe(exc: Exception) -> str:
    if isinstance(exc, HpcRolloutError):
        return str(exc)
    if isinstance(exc, OSError):
        return describe_os_error(exc)
    # a bug: say what, and how to see more
    return (f"internal error {type(exc).__name__}: {exc} (run with {TRACEBACK_ENV}=1 for the traceback, "
            "and please report it)")


def _fail(message: str, code: ExitCode = ExitCode.FAILED) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)
