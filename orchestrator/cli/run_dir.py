"""The RUN_DIR argument of every command: it must exist, and when it does not the error says how
to make one (click's own 'Directory ... does not exist' names no fix)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click


class RunDirType(click.Path):
    """An existing directory; a missing one gets the `hpc-rollout init` hint."""

    name = "run_dir"

    def __init__(self, path_type: type[Any] | None = None) -> None:
        super().__init__(file_okay=False, dir_okay=True, exists=False, path_type=path_type)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = os.fsdecode(value) if isinstance(value, (str, bytes, os.PathLike)) else str(value)
        if not os.path.exists(text):
            self.fail(f"{text} does not exist: create a run directory with `hpc-rollout init {text}`", param, ctx)
        if not os.path.isdir(text):
            self.fail(f"{text} is a file, not a run directory (made by `hpc-rollout init DIR`)", param, ctx)
        return super().convert(value, param, ctx)


RUN_DIR_TYPE = RunDirType()
RUN_DIR_PATH_TYPE = RunDirType(path_type=Path)
