"""run.toml as people read it: every setting with what it does, its default and its range.

`hpc-rollout init` writes this text (and rewrites it after `init --set`); the values are
RunConfig's, so it parses back to the same settings. Each comment is the help its setting is
declared with in orchestrator/config.py (`setting(default, help, bounds)`), so a new knob cannot
arrive undocumented.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import tomli_w

from orchestrator.config import BOUNDS, CLASSES, DATA_SOURCES, DEFAULTS, SETTINGS, RunConfig

SECTIONS: dict[str, str] = {
    "pools": "Concurrent stages per worker (launch --init-pool/--run-pool/--eval-pool override them).",
    "node": "What one worker's sandboxes may hold at once: jobs are admitted by resource class (docs/scale.md).",
    "workers": "Worker life cycle.",
    "jobs": "Every job's budget and retries.",
    "leases": "Heartbeats and leases: how soon the claims of a dead worker go back to their queues.",
    "shutdown": "Stopping (SIGTERM, SIGINT, SIGUSR2, `hpc-rollout stop`).",
    "shards": "When finished rows are committed to shards/*.parquet.",
    "sandbox": "Sandboxes of the jobs that open one.",
    "llm": "LLM backends: health checks and outages.",
    "proxy": "The recording proxy of `harness` jobs: what one agent request may cost its worker.",
    "metrics": "Metrics for other tools.",
    "access": "Who may read the run, and whose files workers act on (docs/robustness.md, threat model).",
    "rewards": "Reward code the operator allows (rows only select it).",
    "trainer": "What the trainer-side readers do.",
    DATA_SOURCES: "verl data_source -> handler, for rows whose data_source names no handler.",
}

# The comment above each setting: its declared help (orchestrator/config.py, on its field).
HELP: dict[str, str] = {dotted: spec.help for dotted, spec in SETTINGS.items()}


def settings_of(config: RunConfig) -> list[tuple[str, list[tuple[str, Any]]]]:
    """(section, [(key, value)]) in RunConfig's order, data_sources last."""
    sections = []
    for section in fields(config):
        if section.name in (DATA_SOURCES, CLASSES):
            continue
        values = getattr(config, section.name)
        sections.append((section.name, [(f.name, getattr(values, f.name)) for f in fields(values)]))
    return sections


def commented_toml(config: RunConfig) -> str:
    """The whole run.toml with a comment above every setting."""
    lines = ["# hpc-rollout run settings. Every value below is the default unless changed (hpc-rollout init",
             "# DIR --set SECTION.KEY=VALUE, or edit this file; workers read it when they start).", ""]
    defaults = DEFAULTS
    for section, values in settings_of(config):
        lines += [f"# {SECTIONS.get(section, '')}", f"[{section}]"]
        for key, value in values:
            dotted = f"{section}.{key}"
            default = getattr(getattr(defaults, section), key)
            lines.append(f"# {HELP.get(dotted, key)}{_range(dotted, default)}")
            lines.append(tomli_w.dumps({key: value}).rstrip("\n"))
        lines.append("")
    lines += [f"# {SECTIONS[DATA_SOURCES]} E.g.:", '# "openai/gsm8k" = "answer"', f"[{DATA_SOURCES}]"]
    lines += [tomli_w.dumps({name: handler}).rstrip("\n") for name, handler in sorted(config.data_sources.items())]
    if config.classes:   # resource classes (orchestrator/resource_class.py): only where declared
        lines += ["", "# Resource classes: what one job of each holds on its node (docs/scale.md)."]
        for name, job_class in sorted(config.classes.items()):
            table = {k: v for k, v in job_class.to_json().items() if k != "name"}
            lines += [f"[{CLASSES}.{name}]", tomli_w.dumps({**table, "handlers": list(job_class.handlers)}).rstrip("\n")]
    return "\n".join(lines) + "\n"


def _range(dotted: str, default: Any) -> str:
    shown = f"Default {tomli_w.dumps({'v': default}).split('=', 1)[1].strip()}"
    bounds = BOUNDS.get(dotted)
    if bounds is None:
        return f". {shown}."
    return f". {shown}, from {_number(bounds[0])} to {_number(bounds[1])}."


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
