"""The files tool: upload and download bytes between host and sandbox (base64 over the socket)."""

from __future__ import annotations

import base64
import os
from typing import Any, Dict

MAX_FILE_BYTES = 64 << 20


class Files:
    def __init__(self, cwd: str) -> None:
        self.cwd = cwd

    def _path(self, args: Dict[str, Any]) -> str:
        path = args.get("path")
        if not isinstance(path, str) or not path:
            raise ValueError("a 'path' is needed")
        return os.path.normpath(os.path.join(self.cwd, path))

    def run(self, args: Dict[str, Any]) -> Dict[str, Any]:
        try:
            if args.get("command") == "upload":
                return self.upload(args)
            if args.get("command") == "download":
                return self.download(args)
            return {"error": "files command must be 'upload' or 'download'"}
        except (OSError, ValueError) as exc:
            return {"error": "%s: %s" % (type(exc).__name__, exc)}

    def upload(self, args: Dict[str, Any]) -> Dict[str, Any]:
        path = self._path(args)
        data = base64.b64decode(args.get("data") or "")
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        tmp = "%s.upload-%d" % (path, os.getpid())
        with open(tmp, "wb") as fh:
            fh.write(data)
        if args.get("mode") is not None:
            os.chmod(tmp, int(args["mode"]))
        os.replace(tmp, path)
        return {"path": path, "size": len(data)}

    def download(self, args: Dict[str, Any]) -> Dict[str, Any]:
        path = self._path(args)
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise ValueError("%s is %d bytes, above the %d-byte download limit; compress or split it"
                             % (path, size, MAX_FILE_BYTES))
        with open(path, "rb") as fh:
            data = fh.read()
        return {"path": path, "size": len(data), "data": base64.b64encode(data).decode("ascii"),
                "mode": os.stat(path).st_mode & 0o7777}
