"""Every worker setting reaches the worker, with the same meaning, from each entry point that takes it:
`python -m orchestrator.worker`, `hpc-rollout launch` (local: through to_args; Slurm: the same object,
pickled), `hpc-rollout adapt`, and a script rendered by `sbatch render worker` (its node_task line).

In-process: each command's own parser (click's make_context) and the rendered script's text; the
options come out of the parameters by WorkerOptions.from_params, which the commands themselves use.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path
from typing import Any, Callable, Iterator

import click
import pytest

from orchestrator.settings_spec import Declared, declarations
from orchestrator.slurm.templates import render
from orchestrator.spool.rundir import init_run
from orchestrator.worker.options import WorkerOptions

DECLARED = declarations(WorkerOptions)
USER_SETTINGS = [name for name, spec in DECLARED.items() if not spec.by_launcher]
# A value other than the default for the settings that parse their own text (the rest derive one).
PARSED_SAMPLES = {"stages": "run,eval"}


@pytest.fixture(scope="module")
def commands() -> Iterator[dict[str, click.Command]]:
    """The entry points' commands; importing the worker's catches stop signals, so they are put back."""
    from orchestrator.worker.signals import STOP_NOW_SIGNAL, STOP_SIGNALS

    handlers = {signum: signal.getsignal(signum) for signum in (*STOP_SIGNALS, STOP_NOW_SIGNAL)}
    try:
        from orchestrator.cli.adapt import adapt_cmd
        from orchestrator.cli.launch import launch_cmd
        from orchestrator.slurm.node_task import main as node_task
        from orchestrator.worker.__main__ import main as worker
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    yield {"worker": worker, "launch": launch_cmd, "adapt": adapt_cmd, "node_task": node_task}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    paths, _ = init_run(tmp_path_factory.mktemp("settings") / "run", {})
    return str(paths.root)


def sample(name: str, spec: Declared) -> str:
    """A value of the setting, other than its default, as text."""
    if spec.parse is not None:
        assert name in PARSED_SAMPLES, f"give {name} a sample value in PARSED_SAMPLES"
        return PARSED_SAMPLES[name]
    if spec.choices:
        return spec.choices[-1]
    low = spec.low or 0
    value = low + 3 if spec.high is None else min(low + 3, spec.high)
    return str(value if spec.kind is int else value + 0.5)


def parsed(command: click.Command, args: list[str]) -> WorkerOptions:
    with command.make_context(command.name or "cmd", args) as ctx:
        return WorkerOptions.from_params(ctx.params)


def entry_points(commands: dict[str, click.Command], run_dir: str) -> dict[str, Callable[[str, str], WorkerOptions]]:
    """How each entry point turns one setting (name, text) into the worker's options."""
    def through_worker(options: WorkerOptions) -> WorkerOptions:   # what a launched local worker is given
        return parsed(commands["worker"], [run_dir, *options.to_args()])

    def rendered(name: str, text: str) -> WorkerOptions:
        script = render("worker", {name: text, "run_dir": run_dir})
        line = next(line for line in script.splitlines() if line.startswith("exec "))
        args = shlex.split(line)
        args = args[args.index("orchestrator.slurm.node_task") + 1:]
        return parsed(commands["node_task"], args)

    flag = DECLARED.__getitem__
    return {
        "python -m orchestrator.worker": lambda n, t: parsed(commands["worker"], [run_dir, flag(n).flag, t]),
        "hpc-rollout launch": lambda n, t: through_worker(parsed(commands["launch"], [run_dir, flag(n).flag, t])),
        "hpc-rollout adapt": lambda n, t: parsed(commands["adapt"], [run_dir, "--max", "1", flag(n).flag, t]),
        "sbatch render worker": rendered,
    }


@pytest.mark.parametrize("name", USER_SETTINGS)
def test_every_worker_setting_reaches_the_worker_from_every_entry_point(
        commands: dict[str, click.Command], run_dir: str, name: str) -> None:
    spec = DECLARED[name]
    text = sample(name, spec)
    expected = WorkerOptions(**{name: spec.check(text)})
    assert expected != WorkerOptions(), f"the sample {text!r} of {name} is its default: choose another"
    for entry, options_of in entry_points(commands, run_dir).items():
        assert options_of(name, text) == expected, f"{name} = {text!r} through {entry}"


def test_launch_max_sandboxes_reaches_the_worker(commands: dict[str, click.Command], run_dir: str) -> None:
    through = entry_points(commands, run_dir)["hpc-rollout launch"]
    assert through("max_sandboxes", "3").max_sandboxes == 3


@pytest.mark.parametrize("name", ["init_pool", "run_pool", "eval_pool", "max_prepared", "max_sandboxes"])
def test_zero_is_zero_on_every_entry_point_and_unset_is_run_toml(
        commands: dict[str, click.Command], run_dir: str, name: str) -> None:
    """0 is the number, as in run.toml (no slots; for max_sandboxes no cap); only an unset option takes run.toml's."""
    for entry, options_of in entry_points(commands, run_dir).items():
        assert getattr(options_of(name, "0"), name) == 0, entry
    assert getattr(parsed(commands["worker"], [run_dir]), name) is None
    assert "--init-pool" not in render("worker", {}) and "--init-pool 0" in render("worker", {"init_pool": "0"})


def test_every_option_of_the_worker_command_is_declared(commands: dict[str, click.Command]) -> None:
    """A flag added to a command by hand, not on WorkerOptions, would reach one entry point only."""
    own = {"worker": {"run_dir", "verbose"}, "node_task": {"run_dir", "verbose", "warning_signal"}}
    for entry, extra in own.items():
        names = {param.name for param in commands[entry].params}
        assert names - extra == set(DECLARED), entry
    for entry in ("launch", "adapt"):
        names = {param.name for param in commands[entry].params}
        assert set(USER_SETTINGS) <= names, f"{entry} lacks {set(USER_SETTINGS) - names}"
        assert not {name for name in DECLARED if DECLARED[name].by_launcher} & names, entry


def test_an_out_of_bounds_value_is_refused_alike(commands: dict[str, click.Command], run_dir: str) -> None:
    """The bounds are run.toml's: a pool above pools.init's range fails on the command line and at render."""
    from orchestrator.config import BOUNDS
    from orchestrator.slurm.errors import TemplateError

    too_many = str(int(BOUNDS["pools.init"][1]) + 1)
    for entry in ("worker", "launch"):
        with pytest.raises(click.BadParameter):
            parsed(commands[entry], [run_dir, "--init-pool", too_many])
    with pytest.raises(TemplateError, match="init_pool"):
        render("worker", {"init_pool": too_many})


def test_to_args_gives_back_the_options() -> None:
    options = WorkerOptions(**{name: DECLARED[name].check(sample(name, DECLARED[name])) for name in USER_SETTINGS},
                            launch_id="l1", launcher_pid=4242)
    values: dict[str, Any] = {}
    args = options.to_args()
    for flag, text in zip(args[::2], args[1::2]):
        name = next(n for n, spec in DECLARED.items() if spec.flag == flag)
        values[name] = DECLARED[name].check(text)
    assert WorkerOptions(**values) == options
