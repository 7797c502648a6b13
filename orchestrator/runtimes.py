"""The sandbox runtimes by name: the one list that run.toml, the CLI options and the sandbox API check.

The implementations live in orchestrator/sandbox/ (apptainer.py, bwrap.py, local.py); this list
sits with the spool primitives because run.toml (config.py) validates [sandbox] runtime.
"""

from __future__ import annotations

import enum


class Runtime(str, enum.Enum):
    AUTO = "auto"              # Apptainer/Singularity when on PATH, else bubblewrap
    APPTAINER = "apptainer"
    BWRAP = "bwrap"
    LOCAL = "local"            # no sandbox: explicit, for development


RUNTIME_NAMES: tuple[str, ...] = tuple(runtime.value for runtime in Runtime)
