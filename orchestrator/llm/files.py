"""JSON files of the LLM layer (the backend registry, in-flight counts), written atomically.

rename() within one directory is atomic on local disks, NFS and Lustre, so a reader sees
either the old or the new content, never a torn file: see fsops.write_atomic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from orchestrator import fsops


def write_json_atomic(path: Path, data: Any, *, indent: bool = False, durable: bool = False) -> None:
    """`durable`: flushed to disk, file and directory, so that it survives a node crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    option = orjson.OPT_INDENT_2 if indent else 0
    fsops.write_atomic(path, orjson.dumps(data, option=option) + b"\n",
                       durability=fsops.Durability.FULL if durable else fsops.Durability.NONE)
