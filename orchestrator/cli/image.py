"""`hpc-rollout image build`: the command-line face of builder.py."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.sandbox.images.cache import Mode


def register_image_commands(cli: click.Group) -> None:
    @cli.group("image")
    def image_group() -> None:
        """Build sandbox images from the Jinja2 Apptainer templates in images/.

        \b
        Examples:
          hpc-rollout image build python --format dir    # a rootfs for bubblewrap
          hpc-rollout image build tasks --format dir     # the bundled tasks' image
        """

    @image_group.command("build")
    @click.argument("template")
    @click.option("--mode", type=click.Choice([m.value for m in Mode]), default="versioned",
                  show_default=True, help="Cache key: versioned = base image + framework version; "
                  "lock = base image + lock file; source = lock + source tree; scratch = no reuse.")
    @click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                  help="Template variable (lists comma-separated), e.g. --set bootstrap=docker.")
    @click.option("--format", "fmt", type=click.Choice(["sif", "dir"]), default=None,
                  help="sif (apptainer build) or dir (a rootfs for bubblewrap). "
                  "Default: sif when apptainer is installed, else dir.")
    @click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
                  default=Path("images/out"), show_default=True)
    @click.option("--lock-file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option("--source", type=click.Path(exists=True, path_type=Path))
    @click.option("--render-only", is_flag=True, help="Print the rendered definition and exit.")
    def build_command(template: str, mode: str, settings: tuple[str, ...], fmt: str | None,
                      out_dir: Path, lock_file: Path | None, source: Path | None,
                      render_only: bool) -> None:
        """Build TEMPLATE (a path, or python | swe | math), reusing cached images.

        \b
        Examples:
          hpc-rollout image build images/python.def.j2 --mode versioned
          hpc-rollout image build swe --format dir --out images/out
          hpc-rollout image build python --mode lock --lock-file requirements.lock
        """
        from orchestrator.sandbox.apptainer import find_apptainer
        from orchestrator.sandbox.images.builder import build_image
        from orchestrator.sandbox.images.templates import find_template, parse_overrides, render

        path = find_template(template)
        variables = parse_overrides(settings)
        if render_only:
            click.echo(render(path, variables).text, nl=False)
            return
        chosen = fmt or ("sif" if find_apptainer() else "dir")
        outcome = build_image(path, mode=mode, variables=variables, fmt=chosen,
                              out_dir=out_dir.absolute(), lock_file=lock_file,
                              source=source.absolute() if source else None)
        verb = "built" if outcome.built else "reused"
        click.echo(f"{verb} {outcome.path} ({outcome.plan.action.value}, {outcome.seconds:.1f} s)")
        if chosen == "dir":
            click.echo(f"use it with: hpc-rollout sandbox exec --image {outcome.path} -- python3 -V")
