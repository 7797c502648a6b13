"""`hpc-rollout sandbox exec` and `image build --render-only` through the real CLI."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from orchestrator.cli import cli
from tests.sandbox.helpers import needs_bwrap


@needs_bwrap
def test_sandbox_exec_prints_output_and_exit_status() -> None:
    runner = CliRunner()
    ok = runner.invoke(cli, ["sandbox", "exec", "--runtime", "bwrap", "--no-network", "--",
                             "python3", "-c", "print(1)"])
    assert ok.exit_code == 0, ok.output
    assert ok.output == "1\n"
    failed = runner.invoke(cli, ["sandbox", "exec", "--runtime", "bwrap", "--", "sh", "-c", "exit 3"])
    assert failed.exit_code == 3


def test_image_build_render_only() -> None:
    result = CliRunner().invoke(cli, ["image", "build", "python", "--render-only",
                                      "--set", "bootstrap=docker", "--set", "base_image=python:3.12-slim"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Bootstrap: docker\nFrom: python:3.12-slim\n")


@needs_bwrap
def test_sandbox_list_shows_live_sandboxes(tmp_path: Path) -> None:
    import asyncio

    from orchestrator.spool.paths import SpoolPaths
    from orchestrator.sandbox.start import start_sandbox

    async def scenario() -> tuple[str, str, str]:
        sb = await start_sandbox("bwrap", job_id="list-000001-000", paths=SpoolPaths.of(tmp_path))
        try:
            listed = CliRunner().invoke(cli, ["sandbox", "list"]).output
        finally:
            await sb.close()
        return listed, sb.record.id, CliRunner().invoke(cli, ["sandbox", "list"]).output

    listed, sandbox_id, after = asyncio.run(scenario())
    assert sandbox_id in listed and "running" in listed and "(alive)" in listed and "list-000001-000" in listed
    assert after.startswith("no sandboxes in")
