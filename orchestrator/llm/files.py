"""Atomic small-file writes: write a hidden temporary next to the target, then rename.

rename() within one directory is atomic on local disks, NFS and Lustre, so a reader sees
either the old or the new content, never a torn file.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import orjson

from orchestrator import fsops


def write_json_atomic(path: Path, data: Any, *, indent: bool = False, durable: bool = False) -> None:
    """`durable`: flushed to disk, file and directory, so that it survives a node crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    option = orjson.OPT_INDENT_2 if indent else 0
    tmp.unlink(missing_ok=True)  # left by a write of this thread that failed (ENOSPC)
    fsops.write_new(tmp, orjson.dumps(data, option=option) + b"\n", sync=durable)
    os.replace(tmp, path)
    if durable:
        fsops.sync_dir(path.parent)

