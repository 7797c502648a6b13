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
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    option = orjson.OPT_INDENT_2 if indent else 0
    content = orjson.dumps(data, option=option) + b"\n"
    # Two metadata operations (create, rename) when all is well: this runs per task started.
    try:
        fsops.write_new(tmp, content, sync=durable)
    except FileNotFoundError:  # first write into a new directory
        fsops.ensure_dir(path.parent)
        fsops.write_new(tmp, content, sync=durable)
    except FileExistsError:  # left by a write of this thread that failed (ENOSPC)
        fsops.unlink(tmp)
        fsops.write_new(tmp, content, sync=durable)
    fsops.replace(tmp, path)
    if durable:
        fsops.sync_dir(path.parent)


def read_json(path: Path) -> Any:
    """Parsed content of `path`; raises FileNotFoundError or orjson.JSONDecodeError."""
    return orjson.loads(path.read_bytes())
