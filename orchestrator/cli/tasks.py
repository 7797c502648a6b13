"""`hpc-rollout tasks check | bundled`: admit task files before a run, write the bundled sets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from orchestrator.cli.console import Tone, err, plain_column, say, styled


@click.group("tasks")
def tasks_group() -> None:
    """Task files: check them (golden must pass, no-op must fail), write the bundled sets, generate reasoning-gym rows.

    \b
    Task families with verifiable rewards (handlers):
      math  problem + answer (DeepScaleR style); python tool; math-verify checks the answer
      code  statement + hidden stdin/stdout tests (optional checker); EVAL runs them in a sandbox
      swe   SWE-bench / SWE-Gym rows; bash + editor in the repository; FAIL_TO_PASS and
            PASS_TO_PASS must all pass
    Each also takes verl rows (data_source, prompt, reward_model.ground_truth, extra_info).

    \b
    Generated, one reply each (pip install 'hpc-rollout[reasoning-gym]'):
      reasoning_gym  reasoning-gym's 105 procedural datasets; each dataset's own scorer grades
            the reply's <answer>...</answer> (`hpc-rollout tasks reasoning-gym --list`)

    \b
    Examples:
      hpc-rollout tasks bundled tasks/
      hpc-rollout tasks check tasks/math.jsonl --handler math
      hpc-rollout tasks reasoning-gym leg_counting --size 100 --seed 1 > legs.jsonl
    """


@tasks_group.command("check")
@click.argument("tasks_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--handler", "handler_name", required=True, help="The task family: math, code, swe (or yours).")
@click.option("--parallel", default=4, show_default=True, type=click.IntRange(1, 256), help="Tasks checked at once.")
@click.option("--runtime", type=click.Choice(["auto", "apptainer", "bwrap", "local"]), default="auto", show_default=True)
@click.option("--image", default=None, help="Sandbox image for tasks that name none (e.g. a `tasks` image).")
@click.option("--allow-image", "allowed_images", multiple=True, metavar="DIR",
              help="Images (or a directory of images) rows may name, as run.toml [sandbox] allowed_images (repeatable).")
@click.option("--allow-bind", "allowed_binds", multiple=True, metavar="DIR",
              help="A host directory rows may bind read-only (e.g. SWE repo_mirrors), as run.toml [sandbox] "
                   "allowed_binds (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per task instead of the report.")
def check_cmd(tasks_file: Path, handler_name: str, parallel: int, runtime: str, image: str | None,
              allowed_images: tuple[str, ...], allowed_binds: tuple[str, ...], as_json: bool) -> None:
    """Grade every task's golden solution (must score 1) and a no-op (must score 0).

    \b
      hpc-rollout tasks check swe_gym.jsonl --handler swe --image images/out/tasks-versioned-... --allow-bind /data/mirrors
      hpc-rollout tasks check math.jsonl --handler math
    Rows are held to a sandbox policy as in a run: only the images and bind sources allowed here,
    no network. Exit status 1 when any task fails a check; the failing ones are listed.
    """
    import asyncio

    import orjson
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from orchestrator.handler_api.contract import HandlerError
    from orchestrator.app.tasks_check import TaskCheck, check_tasks
    from orchestrator.config import DEFAULTS, ConfigError
    from orchestrator.sandbox.policy import SandboxPolicy

    defaults = {"image": image} if image else {}
    try:
        settings = DEFAULTS.with_overrides({"sandbox.allowed_images": list(allowed_images),
                                           "sandbox.allowed_binds": list(allowed_binds)}, source="tasks check")
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    policy = SandboxPolicy.of(settings.sandbox)
    columns = (plain_column("tasks", style=Tone.STRONG.value), BarColumn(), MofNCompleteColumn(),
               plain_column("{task.fields[bad]}"), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=as_json) as progress:
        bar = progress.add_task("tasks", total=None, bad="")
        failed = 0

        def done(check: TaskCheck) -> None:
            nonlocal failed
            failed += not check.ok
            progress.update(bar, advance=1, bad=f"{failed} failing" if failed else "")

        try:
            results = asyncio.run(check_tasks(tasks_file, handler_name, runtime=runtime, sandbox_defaults=defaults,
                                              sandbox_policy=policy, parallel=parallel, on_done=done))
        except (HandlerError, ValueError, ImportError) as exc:   # ImportError: a package every task needs
            raise click.ClickException(str(exc)) from None
        progress.update(bar, total=len(results), completed=len(results))
    if as_json:
        for check in results:
            click.echo(orjson.dumps(check.to_json()).decode())
    else:
        bad = [c for c in results if not c.ok]
        say(f"{len(results)} tasks checked: {len(results) - len(bad)} ok, {len(bad)} failing")
        for check in bad:
            say(styled("FAIL", Tone.ERROR), f" {tasks_file}:{check.line} ({check.instance_id})")
            for problem in check.problems:
                say(f"     {problem}")
    if any(not c.ok for c in results):
        raise SystemExit(1)


@tasks_group.command("bundled")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def bundled_cmd(directory: Path) -> None:
    """Write the bundled task sets (20 math, 10 code, 3 SWE repositories) into DIRECTORY, and name the
    generated family (reasoning-gym's datasets: `hpc-rollout tasks reasoning-gym --list`).

    \b
    Example:
      hpc-rollout tasks bundled tasks/ && hpc-rollout submit spool/run1 tasks/math.jsonl --handler math

    Also writes the SWE repositories' git mirrors and scripted policies for
    `serve-llm --scripted` that solve every task (scripts/right.jsonl) or do not (wrong.jsonl).
    """
    from hpc_rollout.handlers.bundled.write import write_bundled

    bundled = write_bundled(directory)
    for family in ("math", "code", "swe"):
        path = bundled.tasks(family)
        count = sum(1 for line in path.read_text().splitlines() if line.strip())
        say(f"{family:5} {count:3d} tasks  {path}")
    say(f"scripted policies: {bundled.right} {bundled.wrong} {bundled.decoy}")
    # Generated, not written: reasoning-gym makes any number of rows of each of its datasets.
    say("reasoning_gym: 105 reasoning-gym datasets, generated rather than written (pip install "
        "'hpc-rollout[reasoning-gym]'): `hpc-rollout tasks reasoning-gym --list` names them, "
        "`hpc-rollout tasks reasoning-gym NAME --size N > rows.jsonl` writes rows")


def _option(text: str) -> tuple[str, Any]:
    """`k=v`: v as JSON when it parses (5, true, ["+", "-"]), else as the text itself."""
    import json

    key, equals, value = text.partition("=")
    if not equals or not key:
        raise click.BadParameter(f"{text!r}: give KEY=VALUE, e.g. max_animals=5", param_hint="--option")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


@tasks_group.command("reasoning-gym")
@click.argument("name", required=False)
@click.option("--size", default=100, show_default=True, type=click.IntRange(1, 10_000_000),
              help="Entries of the dataset: one row each (index 0 to size - 1).")
@click.option("--seed", default=0, show_default=True, type=int, help="The dataset's seed.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="A dataset option (create_dataset keyword; VALUE as JSON when it parses), repeatable.")
@click.option("--list", "list_names", is_flag=True, help="List the datasets (and each one's options) instead.")
def reasoning_gym_cmd(name: str | None, size: int, seed: int, options: tuple[str, ...], list_names: bool) -> None:
    """Rows of one of reasoning-gym's datasets, one JSON object a line, for the reasoning_gym handler.

    \b
      hpc-rollout tasks reasoning-gym leg_counting --size 100 --seed 1 > legs.jsonl
      hpc-rollout tasks reasoning-gym spell_backward --size 50 --option max_word_len=6 >> mix.jsonl
      hpc-rollout tasks reasoning-gym --list
      hpc-rollout submit spool/run1 legs.jsonl --handler reasoning_gym
    Each row names its entry (dataset, seed, size, index, options); the worker generates it. Needs
    reasoning-gym: pip install 'hpc-rollout[reasoning-gym]'.
    """
    import orjson

    from hpc_rollout.handlers import reasoning_gym_data as data

    try:
        if list_names or not name:
            names = data.dataset_names()
            for found in names:
                click.echo(f"{found:28} {', '.join(data.option_names(found))}")
            say(f"{len(names)} datasets; rows: hpc-rollout tasks reasoning-gym NAME --size N [--option KEY=VALUE]")
            return
        rows = data.reasoning_gym_rows(name, size, seed, **dict(_option(text) for text in options))
    except (ValueError, ImportError) as exc:
        raise click.ClickException(str(exc)) from None
    for row in rows:
        click.echo(orjson.dumps(row).decode())


def register(cli: click.Group) -> None:
    cli.add_command(tasks_group)
