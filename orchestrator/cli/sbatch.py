"""`hpc-rollout sbatch render NAME --set k=v`: print a ready-to-submit batch script."""

from __future__ import annotations

import re

import click

from orchestrator.slurm.cluster import max_array_size
from orchestrator.slurm.errors import TemplateError
from orchestrator.slurm.templates import parse_assignments, render, settings_of, template_names


def _describe(name: str) -> str:
    lines = [f"{name}:"]
    for s in settings_of(name):
        default = "(required)" if s.required else f"[default: {s.default}]" if s.default not in (None, ()) else ""
        choices = f" {{{'|'.join(s.choices)}}}" if s.choices else ""
        lines.append(f"  {s.name:<18} {s.kind.value:<8} {s.help}{choices} {default}".rstrip())
    return "\n".join(lines)


def array_too_large(text: str) -> str | None:
    """A warning when the script's array indices reach the site's MaxArraySize (sbatch refuses it)."""
    match = re.search(r"^#SBATCH --array=0-(\d+)", text, re.MULTILINE)
    if match is None:
        return None
    last, limit = int(match.group(1)), max_array_size()
    if last < limit:
        return None
    return (
        f"warning: this array has indices 0-{last}, but this cluster's MaxArraySize is {limit} "
        f"(indices must stay below it), so sbatch will refuse it; `hpc-rollout launch --nodes "
        f"{last + 1}` splits large arrays by itself, or render several scripts with fewer nodes"
    )


def register(cli: click.Group) -> None:
    @cli.group("sbatch")
    def sbatch_group() -> None:
        """Jinja2 sbatch templates (worker, eval, vllm) for users who prefer sbatch by hand.

        \b
        Examples:
          hpc-rollout sbatch list
          hpc-rollout sbatch render worker --set nodes=8 --set partition=batch > worker.sbatch
        """

    @sbatch_group.command("render")
    @click.argument("name", type=click.Choice(template_names()))
    @click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
                  help="A template setting; repeat a key (setup=...) to give several lines.")
    @click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
                  help="Write the script to this file instead of stdout.")
    def render_command(name: str, assignments: tuple[str, ...], output: str | None) -> None:
        """Print the batch script NAME rendered with --set values (all of them shell-quoted).

        \b
        Examples:
          hpc-rollout sbatch render worker --set nodes=8 --set partition=batch > worker.sbatch
          hpc-rollout sbatch render vllm --set model=/models/qwen --set gpus=4 > vllm.sbatch
          hpc-rollout sbatch list            # every template with its settings
        """
        try:
            text = render(name, parse_assignments(assignments))
        except TemplateError as exc:
            raise click.UsageError(str(exc)) from exc
        warning = array_too_large(text)
        if warning:
            click.echo(warning, err=True)
        if output:
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(text)
            click.echo(f"wrote {output}; submit with: sbatch {output}", err=True)
        else:
            click.echo(text, nl=False)

    @sbatch_group.command("list")
    @click.argument("name", required=False, type=click.Choice(template_names()))
    def list_command(name: str | None) -> None:
        """The templates and their settings (kind, meaning, default).

        \b
        Examples:
          hpc-rollout sbatch list
          hpc-rollout sbatch list vllm
        """
        for template in [name] if name else template_names():
            click.echo(_describe(template))
