"""run.toml as people read it: every setting with what it does, its default and its range.

`hpc-rollout init` writes this text (and rewrites it after `init --set`); the values are
RunConfig's, so it parses back to the same settings. A test checks that every setting of
RunConfig has its line here, so a new knob cannot arrive undocumented.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import tomli_w

from orchestrator.config import BOUNDS, CLASSES, DATA_SOURCES, DEFAULTS, RUNTIME_NAMES, RunConfig

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

HELP: dict[str, str] = {
    "pools.init": "INIT stages at once (sandbox start, task setup)",
    "pools.run": "agent loops (RUN stages) at once",
    "pools.eval": "EVAL stages at once",
    "pools.max_prepared": "INIT pauses while this node's run queue holds this many jobs",
    "pools.max_sandboxes": "cap on INIT + prepared + RUN jobs of a worker (0: no cap)",
    "node.memory_mb": "sandbox memory a worker's jobs may hold at once, by their classes (0: not counted)",
    "node.cpus": "sandbox CPUs a worker's jobs may hold at once, by their classes (0: not counted)",
    "workers.idle_exit_s": "a worker with nothing to claim and nothing in flight this long exits (0: never)",
    "jobs.timeout_s": "budget per job, counting only time inside stages (not queues)",
    "jobs.max_attempts": "a job whose worker was lost this many times ends failed",
    "jobs.batch_size": "consecutive jobs `submit` puts in one queue entry (1: one ticket per job)",
    "leases.heartbeat_s": "how often a worker refreshes workers/WORKER.json",
    "leases.lease_s": "claims of a worker silent this long go back to their queue (>= 3 heartbeats)",
    "shutdown.grace_s": "time running stages get to finish on a stop; a second signal ends them at once",
    "shards.max_rows": "a commit is due once this many rows wait (a shard takes every row waiting: more on a busy worker)",
    "shards.max_bytes": "a commit is due once the rows waiting reach this many bytes (as JSON, before Parquet encoding)",
    "shards.max_age_s": "a finished row waits at most this long before its shard is committed",
    "shards.idle_flush_s": "commit early when EVAL has had nothing new for this long (at once when the worker holds no job)",
    "sandbox.runtime": f"{' | '.join(RUNTIME_NAMES)} (auto: Apptainer when installed, else bubblewrap)",
    "sandbox.image": "default image for handlers that name none (\"\": the host's /usr, bubblewrap)",
    "sandbox.network": "default network access of sandboxes",
    "sandbox.fakeroot": "run as root inside the sandbox (user namespace)",
    "sandbox.total_memory_mb": "memory of a whole sandbox (cgroup memory.max; else RLIMIT_AS per process)",
    "sandbox.workspace_mb": "size of /workspace (a tmpfs in the sandbox with bubblewrap)",
    "sandbox.processes": "processes per sandbox (its pids cgroup; with rlimits, per user namespace)",
    "sandbox.allowed_images": "images (or directories of images) a row may name besides the run's own (never /)",
    "sandbox.allowed_binds": "read-only bind sources a row may name must lie inside one of these",
    "sandbox.allowed_rw_binds": "read-write bind sources a row may name (the job's own directory always)",
    "sandbox.network_handlers": "handlers whose rows may turn the network on",
    "sandbox.keep_workspaces": "keep each job's workspace after its row (jobs/XX/JOB/workspace-kept.*)",
    "llm.health_check_s": "GET /health before giving a task to a backend silent this long (0: never)",
    "llm.probe_after_s": "a down backend is probed again after this long",
    "llm.request_timeout_s": "one generation request; past it the backend is marked down",
    "llm.outage_wait_s": "with no usable backend, a job waits this long for one (within its budget), then fails",
    "llm.view_s": "runs of > 16 workers: the cluster summary is re-read at most this often (0: never used)",
    "proxy.max_body_mb": "a request body over this is refused (413) before it is read",
    "proxy.max_chars_per_token": "new text beyond the context's room at this many characters per token is refused untokenized",
    "access.group": "a group that may read the run (dirs 0750 + setgid, files 0640; \"\": owner only)",
    "access.trusted": "users besides the owner and root whose tickets, batches and registries workers accept",
    "rewards.verl_custom_path": "a Python file with verl's custom reward function, run at EVAL (\"\": none)",
    "rewards.verl_custom_name": "the function in verl_custom_path",
    "rewards.truncated_reward": "what an answer cut at the length limit earns (stop_reason truncated; math, answer), not graded",
    "metrics.prometheus_dir": "node-exporter textfile directory (\"\": off; relative: inside the run)",
    "metrics.tensorboard_dir": "TensorBoard event files of each worker in DIR/<run>/<worker> (\"\": off; relative: inside the run)",
    "metrics.wandb_project": "W&B project: one run per worker, grouped by the run's name (\"\": off)",
    "metrics.wandb_mode": "online | offline (then `wandb sync`) | \"\": W&B's own choice (WANDB_MODE, else online)",
    "trainer.staleness": "restart | continue: a job whose policy fell behind is cancelled and resubmitted, or keeps its turns and goes on with the new weights (submit --staleness)",
    "trainer.max_policy_lag": "rows of policies older than current - lag are not trained on (-1: no bound)",
}


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
