"""The editor tool: view, create, str_replace, insert and undo on files in the sandbox."""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List

MAX_VIEW_CHARS = 64_000
MAX_HISTORY = 20


class Editor:
    def __init__(self, cwd: str) -> None:
        self.cwd = cwd
        self.history: Dict[str, List["str | None"]] = {}   # path -> earlier contents (None: absent)
        self.lock = threading.Lock()

    def _path(self, args: Dict[str, Any]) -> str:
        path = args.get("path")
        if not isinstance(path, str) or not path:
            raise ValueError("the editor needs a 'path'")
        return os.path.normpath(os.path.join(self.cwd, path))

    def run(self, args: Dict[str, Any]) -> Dict[str, Any]:
        command = args.get("command")
        handlers = {
            "view": self.view, "create": self.create, "str_replace": self.str_replace,
            "insert": self.insert, "undo": self.undo,
        }
        if command not in handlers:
            return {"error": "unknown editor command %r; use one of %s" % (command, ", ".join(handlers))}
        with self.lock:
            try:
                return handlers[command](self._path(args), args)
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                return {"error": "%s: %s" % (type(exc).__name__, exc)}

    def _read(self, path: str) -> str:
        if not os.path.isfile(path):
            raise ValueError("%s does not exist or is not a file; create it first" % path)
        with open(path, encoding="utf-8") as fh:
            return fh.read()

    def _write(self, path: str, text: str) -> None:
        previous = None
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as fh:
                previous = fh.read()
        stack = self.history.setdefault(path, [])
        stack.append(previous)
        del stack[:-MAX_HISTORY]
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)

    def view(self, path: str, args: Dict[str, Any]) -> Dict[str, Any]:
        if os.path.isdir(path):
            entries = sorted(os.listdir(path))
            shown = [e + ("/" if os.path.isdir(os.path.join(path, e)) else "") for e in entries]
            return {"output": "\n".join(shown), "path": path, "kind": "directory"}
        lines = self._read(path).split("\n")
        start, end = 1, len(lines)
        view_range = args.get("view_range")
        if view_range is not None:
            if not (isinstance(view_range, (list, tuple)) and len(view_range) == 2):
                raise ValueError("view_range must be [start, end] (1-based, end -1 = last line)")
            start, end = int(view_range[0]), int(view_range[1])
            if end == -1:
                end = len(lines)
            if not 1 <= start <= end <= len(lines):
                raise ValueError(
                    "view_range %s is outside the file's %d lines" % (list(view_range), len(lines))
                )
        numbered = "\n".join("%6d\t%s" % (n, lines[n - 1]) for n in range(start, end + 1))
        truncated = len(numbered) > MAX_VIEW_CHARS
        return {"output": numbered[:MAX_VIEW_CHARS], "path": path, "truncated": truncated,
                "lines": len(lines)}

    def create(self, path: str, args: Dict[str, Any]) -> Dict[str, Any]:
        text = args.get("file_text")
        if not isinstance(text, str):
            raise ValueError("create needs 'file_text'")
        self._write(path, text)
        return {"output": "created %s" % path, "path": path}

    def str_replace(self, path: str, args: Dict[str, Any]) -> Dict[str, Any]:
        old, new = args.get("old_str"), args.get("new_str", "")
        if not isinstance(old, str) or not old:
            raise ValueError("str_replace needs a non-empty 'old_str'")
        if not isinstance(new, str):
            raise ValueError("'new_str' must be a string")
        text = self._read(path)
        count = text.count(old)
        if count == 0:
            return {"error": "old_str not found in %s; view the file and copy the text exactly" % path}
        if count > 1:
            lines = [str(text[:i].count("\n") + 1) for i in _positions(text, old)]
            return {"error": "old_str occurs %d times in %s (lines %s); add context to make it unique"
                    % (count, path, ", ".join(lines))}
        self._write(path, text.replace(old, new, 1))
        line = text[: text.index(old)].count("\n") + 1
        return {"output": "replaced 1 occurrence at line %d of %s" % (line, path), "path": path}

    def insert(self, path: str, args: Dict[str, Any]) -> Dict[str, Any]:
        text = self._read(path)
        new = args.get("new_str")
        if not isinstance(new, str):
            raise ValueError("insert needs 'new_str'")
        lines = text.split("\n")
        at = args.get("insert_line")
        if not isinstance(at, int) or not 0 <= at <= len(lines):
            raise ValueError("insert_line must be between 0 and %d (0 = before the first line)" % len(lines))
        new_lines = new.split("\n")
        self._write(path, "\n".join(lines[:at] + new_lines + lines[at:]))
        return {"output": "inserted %d line(s) after line %d of %s" % (len(new_lines), at, path),
                "path": path}

    def undo(self, path: str, args: Dict[str, Any]) -> Dict[str, Any]:
        stack = self.history.get(path)
        if not stack:
            return {"error": "no edit of %s to undo" % path}
        previous = stack.pop()
        if previous is None:
            os.unlink(path)
            return {"output": "undid the creation of %s (removed)" % path, "path": path}
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(previous)
        return {"output": "restored %s to its previous content" % path, "path": path}


def _positions(text: str, needle: str) -> List[int]:
    found, start = [], text.find(needle)
    while start >= 0:
        found.append(start)
        start = text.find(needle, start + 1)
    return found
