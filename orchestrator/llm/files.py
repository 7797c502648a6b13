"""JSON files of the LLM layer (the backend registry, in-flight counts), written atomically.

rename() within one directory is atomic on local disks, NFS and Lustre, so a reader sees
either the old or the new content, never a torn file: see fsops.write_atomic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import orjson

from orchestrator.spool import fsops


def write_json_atomic(path: Path, data: Any, *, indent: bool = False, durable: bool = False,
                      fence: Callable[[], bool] | None = None) -> None:
    """`durable`: flushed to disk, file and directory, so that it survives a node crash.
    `fence`: see fsops.write_atomic (FenceLost when the writer lost its lock)."""
    option = orjson.OPT_INDENT_2 if indent else 0
    content = orjson.dumps(data, option=option) + b"\n"
    durability = fsops.Durability.FULL if durable else fsops.Durability.NONE
    # Two metadata operations (create, rename) when all is well: this runs per task started.
    try:
        fsops.write_atomic(path, content, durability=durability, fence=fence)
    except FileNotFoundError:  # first write into a new directory
        fsops.ensure_dir(path.parent)
        fsops.write_atomic(path, content, durability=durability, fence=fence)
