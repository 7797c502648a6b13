"""The two node-worker paths (`launch --nodes` through submitit, and `sbatch render worker`) ask
Slurm for the same thing by default: one source of defaults, checked on the rendered scripts."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.slurm.launcher import render_script
from orchestrator.slurm.options import LaunchOptions
from orchestrator.slurm.templates import render
from orchestrator.slurm.timespec import parse_minutes


def directives(script: str) -> dict[str, str]:
    found = {}
    for line in script.splitlines():
        match = re.match(r"#SBATCH --([a-z-]+)(?:=(.*))?$", line)
        if match:
            found[match.group(1)] = match.group(2) or ""
    return found


def test_launch_and_the_worker_template_share_their_defaults(tmp_path: Path) -> None:
    launched = directives(render_script(tmp_path, LaunchOptions(nodes=2), 2))
    rendered = directives(render("worker", {"nodes": 2}))
    assert parse_minutes(launched["time"]) == parse_minutes(rendered["time"]) == parse_minutes(LaunchOptions.time)
    # The template signals the batch shell (B:) whose trap forwards it; submitit signals the task.
    assert launched["signal"] == rendered["signal"].removeprefix("B:") == "USR2@90"
    for key in ("exclusive", "requeue", "nodes", "ntasks-per-node", "open-mode"):
        assert launched[key] == rendered[key], key


def test_the_worker_template_takes_its_defaults_from_launch_options() -> None:
    from orchestrator.slurm import options, templates

    by_name = {s.name: s.default for s in templates.settings_of("worker")}
    assert (by_name["time"], by_name["signal"], by_name["signal_delay_s"], by_name["exclusive"]) == (
        options.DEFAULT_TIME, options.DEFAULT_SIGNAL, options.DEFAULT_SIGNAL_DELAY_S, LaunchOptions.exclusive)
