"""Creating and opening run directories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.spool import fsops
from orchestrator.config import RunConfig
from orchestrator.spool.paths import SpoolPaths


def init_run(root: str | Path, overrides: dict[str, Any] | None = None) -> tuple[SpoolPaths, RunConfig]:
    """Create a run directory (idempotent: an existing run.toml is kept, overrides are applied)."""
    paths = SpoolPaths.of(root)
    for directory in paths.directories():
        directory.mkdir(parents=True, exist_ok=True)
    config = RunConfig.load(paths.run_config) if paths.run_config.exists() else RunConfig()
    if overrides:
        config = config.with_overrides(overrides, source="--set")
    if overrides or not paths.run_config.exists():
        fsops.write_atomic(paths.run_config, config.to_toml().encode(), paths.tmp, fsops.Durability.FULL)
    return paths, config


def open_run(root: str | Path) -> tuple[SpoolPaths, RunConfig]:
    """An existing run directory and its configuration, or ConfigError saying how to make one."""
    paths = SpoolPaths.of(root)
    return paths, RunConfig.load(paths.run_config)
