"""Is Slurm on this machine, and what does the site allow? Read-only, cheap, never raises on absence."""

from __future__ import annotations

import functools
import shutil
import subprocess

from orchestrator.slurm.errors import SlurmClientMissing, SlurmCommandFailed, SlurmUnavailable

# Slurm's own default; a site that changed it says so in `scontrol show config`.
DEFAULT_MAX_ARRAY_SIZE = 1001
COMMAND_TIMEOUT_S = 20.0


def slurm_available() -> bool:
    """True when the client commands a launch needs are on PATH (the controller may still be down)."""
    return all(shutil.which(cmd) for cmd in ("sbatch", "srun", "squeue"))


def run_slurm(args: list[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Run a Slurm client command and return its stdout; SlurmUnavailable when it cannot answer."""
    if shutil.which(args[0]) is None:
        raise SlurmClientMissing(f"{args[0]} is not on PATH: this machine has no Slurm client")
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnavailable(f"{' '.join(args)} did not answer within {timeout_s:.0f}s") from exc
    if done.returncode != 0:
        raise SlurmCommandFailed(args, done.returncode, done.stderr.strip())
    return done.stdout


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` lines `Key = value` as a dict."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            config[key.strip()] = value.strip()
    return config


@functools.lru_cache(maxsize=1)
def site_config() -> dict[str, str]:
    try:
        return parse_config(run_slurm(["scontrol", "show", "config"]))
    except SlurmUnavailable:
        return {}


def max_array_size() -> int:
    """The site's MaxArraySize: array indices must stay below it."""
    raw = site_config().get("MaxArraySize", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_MAX_ARRAY_SIZE
