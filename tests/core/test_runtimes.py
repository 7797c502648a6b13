"""One list of sandbox runtimes: run.toml, the sandbox API and every --runtime option agree."""

from __future__ import annotations

import click

from orchestrator import config
from orchestrator.cli import cli
from orchestrator.runtimes import RUNTIME_NAMES, Runtime
from orchestrator.sandbox import api
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
