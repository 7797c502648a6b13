"""Creating and opening run directories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.spool import access, fsops
from orchestrator.config import RunConfig
from orchestrator.spool.paths import SpoolPaths
from orchestrator.run_toml import commented_toml


def init_run(root: str | Path, overrides: dict[str, Any] | None = None) -> tuple[SpoolPaths, RunConfig]:
    """Create a run directory (idempotent: an existing run.toml is kept, overrides are applied)."""
    paths = SpoolPaths.of(root)
    config = planned_config(root, overrides)
    access.prepare(paths, config.access)   # explicit modes, whatever the umask (docs/robustness.md)
    if overrides or not paths.run_config.exists():
        fsops.write_atomic(paths.run_config, commented_toml(config).encode(), paths.tmp, fsops.Durability.FULL)
    return paths, config


def planned_config(root: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The settings `init_run(root, overrides)` would write (nothing is written)."""
    paths = SpoolPaths.of(root)
    config = RunConfig.load(paths.run_config) if paths.run_config.exists() else RunConfig()
    return config.with_overrides(overrides, source="--set") if overrides else config


def open_run(root: str | Path) -> tuple[SpoolPaths, RunConfig]:
    """An existing run directory and its configuration, or ConfigError saying how to make one."""
    paths = SpoolPaths.of(root)
    config = RunConfig.load(paths.run_config)
    access.open_for(paths, config.access)
    return paths, config
