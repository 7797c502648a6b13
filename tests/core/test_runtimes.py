"""One list of sandbox runtimes: run.toml, the sandbox API and every --runtime option agree."""

from __future__ import annotations

import click

from orchestrator import config
from orchestrator.cli import cli
from orchestrator.config import RUNTIME_NAMES, Runtime
from orchestrator.sandbox import start as api
from orchestrator.worker.__main__ import main as worker_main


def _runtime_choices(command: click.Command) -> tuple[str, ...]:
    option = next(p for p in command.params if p.name == "runtime")
    assert isinstance(option.type, click.Choice)
    return tuple(option.type.choices)


def test_every_place_that_names_runtimes_uses_the_one_list() -> None:
    assert RUNTIME_NAMES == ("auto", "apptainer", "bwrap", "local") == tuple(r.value for r in Runtime)
    assert config.RUNTIMES == api.RUNTIMES == RUNTIME_NAMES
    assert _runtime_choices(worker_main) == RUNTIME_NAMES
    assert _runtime_choices(cli.commands["launch"]) == RUNTIME_NAMES
    assert _runtime_choices(cli.commands["sandbox"].commands["exec"]) == RUNTIME_NAMES  # type: ignore[attr-defined]


def test_every_runtime_but_auto_has_one_class_stating_its_differences() -> None:
    assert set(api.RUNTIME_CLASSES) == set(Runtime) - {Runtime.AUTO}
    assert all(cls.name is runtime for runtime, cls in api.RUNTIME_CLASSES.items())
    differences = {runtime.value: (cls.inside_workspace, cls.mounts_tmpfs_workspace, cls.reports_child_pid,
                                   cls.needs_host_env, cls.confinable)
                   for runtime, cls in api.RUNTIME_CLASSES.items()}
    assert differences == {
        "bwrap": ("/workspace", True, True, False, True),          # own tmpfs, --json-status-fd
        "apptainer": ("/workspace", False, False, True, True),     # reads APPTAINER_* from the host env
        "local": (None, False, False, False, False),               # a host process: host paths, no cgroup
    }


def test_an_unknown_runtime_names_the_valid_ones() -> None:
    import pytest

    from orchestrator.sandbox.errors import SandboxConfigError

    with pytest.raises(SandboxConfigError, match="choose one of auto, apptainer, bwrap, local"):
        api.resolve_runtime("docker")
