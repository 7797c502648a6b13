"""One error base: every expected error of the package derives from HpcRolloutError, and the
command line turns any of them into one line (the message names the fix), never "internal error"."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import click
import pytest

import orchestrator
from orchestrator.cli.errors import run_guarded
from orchestrator.devserver.checkpoint import CheckpointError
from orchestrator.errors import HpcRolloutError
from orchestrator.report.inspect_job import JobNotFound
from orchestrator.spool.lease import LockTimeout
from orchestrator.spool.staleness import StalePolicy
from orchestrator.trainer.cursor import CursorError

# Runs inside the sandbox with the image's python and the standard library only: it cannot
# import the host package (see its __init__), so its errors cannot share the base.
IN_SANDBOX = "orchestrator.sandbox.server"
# Modules of an optional extra, importable only with it installed; they define no exception class
# of their own (checked statically below), so the walk loses nothing by leaving them out.
NEEDS_EXTRA = {"orchestrator.trainer.verl.manager": "verl", "orchestrator.trainer.verl.checkpoint_hook": "verl",
               "orchestrator.trainer.verl.tq_manager": "verl"}


def public_exception_classes() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for module_info in pkgutil.walk_packages(orchestrator.__path__, "orchestrator."):
        if module_info.name == IN_SANDBOX or module_info.name.startswith(IN_SANDBOX + ".") \
                or module_info.name in NEEDS_EXTRA:
            continue
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and not name.startswith("_")
                    and value.__module__ == module.__name__):
                found.append(value)
    return found


def test_modules_of_an_optional_extra_define_no_exception_class() -> None:
    for name in NEEDS_EXTRA:
        path = Path(orchestrator.__path__[0]).parent.joinpath(*name.split(".")).with_suffix(".py")
        classes = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)]
        raising = [c.name for c in classes if any(("Error" in ast.unparse(b) or "Exception" in ast.unparse(b))
                                                  for b in c.bases)]
        assert raising == [], f"{name} cannot be imported without its extra: define {raising} in a module that can"


def test_every_public_exception_of_the_package_derives_from_the_one_base() -> None:
    classes = public_exception_classes()
    assert len(classes) >= 40, [c.__qualname__ for c in classes]  # the walk found the package's errors
    outside = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, HpcRolloutError)]
    assert outside == [], "derive these from orchestrator.errors.HpcRolloutError: " + ", ".join(outside)


@pytest.mark.parametrize("second_base, error", [
    (ValueError, CursorError), (LookupError, JobNotFound), (ValueError, CheckpointError),
    (TimeoutError, LockTimeout)])
def test_errors_keep_the_builtin_base_their_callers_catch(second_base: type[BaseException],
                                                          error: type[BaseException]) -> None:
    assert issubclass(error, second_base) and issubclass(error, HpcRolloutError)


@pytest.mark.parametrize("error", [CursorError, JobNotFound, CheckpointError, LockTimeout, StalePolicy])
def test_an_expected_error_escaping_a_command_is_one_line(error: type[BaseException],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    message = f"{error.__name__} happened: do this to fix it"

    @click.command()
    def command() -> None:
        raise error(message)

    with pytest.raises(SystemExit) as exited:
        run_guarded(lambda: command(args=[], prog_name="hpc-rollout", standalone_mode=True))
    assert exited.value.code == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [f"Error: {message}"]
