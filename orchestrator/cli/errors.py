"""The last line of defence of the command line: one line naming the problem, never a traceback.

Commands turn the errors they expect into click errors themselves; whatever escapes them ends
here. Every expected error derives from HpcRolloutError (orchestrator/errors.py) and carries a
message that names the fix; operating-system errors are described (a full disk says so);
anything else is reported as an internal error, with the traceback available through
HPC_ROLLOUT_TRACEBACK=1.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Callable, NoReturn

import click

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
    """Run the click command; print escaped errors as one line and exit 1."""
    if os.environ.get(TRACEBACK_ENV):
        command()
        return
    try:
        command()
    except HpcRolloutError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(describe_os_error(exc))
    except Exception as exc:  # a bug: say what, and how to see more
        _fail(f"internal error {type(exc).__name__}: {exc} (run with {TRACEBACK_ENV}=1 for the traceback, "
              "and please report it)")


def _fail(message: str) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(1)
