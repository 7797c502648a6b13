"""Every command and group of `hpc-rollout` has a --help with at least one example of itself, and shell
completion works as the README says (issue 24, items 7 and 10)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import click
import pytest

from orchestrator.cli import cli


def walk(command: click.Command, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, (*path, name))


COMMANDS = list(walk(cli, ("hpc-rollout",)))


def test_the_tree_is_walked() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"hpc-rollout init", "hpc-rollout stop", "hpc-rollout backend add", "hpc-rollout sandbox list"} <= names


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_shows_an_example_of_the_command_itself(path: tuple[str, ...], command: click.Command) -> None:
    text = command.get_help(click.Context(command, info_name=" ".join(path)))
    prefix = " ".join(path) + (" " if len(path) > 1 else "")
    examples = [line.strip() for line in text.splitlines() if line.strip().startswith(prefix)]
    assert examples, f"`{' '.join(path)} --help` has no example line starting with {prefix!r}:\n{text}"


def test_bash_completion_completes_commands_and_options() -> None:
    env = {**os.environ, "_HPC_ROLLOUT_COMPLETE": "bash_source"}
    script = subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert script.returncode == 0 and "complete -o nosort -F" in script.stdout, script.stdout + script.stderr
    env = {**os.environ, "_HPC_ROLLOUT_COMPLETE": "bash_complete", "COMP_WORDS": "hpc-rollout sta", "COMP_CWORD": "1"}
    words = subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert "status" in words.stdout, words.stdout + words.stderr
