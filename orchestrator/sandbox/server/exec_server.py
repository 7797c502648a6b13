"""The execution server: one per sandbox, listening on a Unix socket, serving the tools.

Start-up protocol (host side: orchestrator/sandbox/launch.py):
  1. the host writes one JSON line of configuration on our stdin (the secret travels
     this way so that it is in neither argv nor the environment);
  2. we apply the resource limits to ourselves (children inherit them, and an agent
     cannot raise a hard limit), bind the socket, and print "READY <pid>" on stdout.
Wire protocol: JSON lines. The first request of a connection must be {"auth": SECRET}.
Then {"id": n, "tool": "bash|python|editor|files|interrupt|ping|shutdown", "args": {...}}
gets {"id": n, "ok": true, "result": {...}}. Tool failures are results with an "error"
key; a request the server cannot parse gets {"ok": false, "error": ...}.
"""

from __future__ import annotations

import hmac
import json
import os
import resource
import signal
import socket
import struct
import sys
import threading
import time
from typing import TYPE_CHECKING

from .tools.bash import BashSession

if TYPE_CHECKING:  # typing costs start-up time; annotations stay strings
    from typing import Any, Callable, Dict, Optional

MAX_REQUEST_BYTES = 96 << 20


class Server:
    def __init__(self, config: "Dict[str, Any]") -> None:
        self.secret = str(config["secret"])
        self.socket_path = str(config["socket"])
        cwd = str(config.get("cwd") or os.getcwd())
        env = {str(k): str(v) for k, v in (config.get("env") or {}).items()}
        self.cwd, self.env = cwd, env
        self.command_timeout = config.get("command_timeout_s")
        self.bash = BashSession(cwd, env, config.get("command_timeout_s"), on_start=self.note_tools)
        self._python: "Any" = None
        self._editor: "Any" = None
        self._files: "Any" = None
        self._lazy_lock = threading.Lock()
        self.tools: "Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]]" = {
            "bash": self.bash.run,
            "python": lambda args: self.python.run(args),
            "editor": lambda args: self.editor.run(args),
            "files": lambda args: self.files.run(args),
            "interrupt": self.interrupt,
            "ping": lambda args: {"pid": os.getpid(), "time": time.time()},
            "warm": self.warm,
        }
        self.listener: "socket.socket | None" = None

    def warm(self, args: "Dict[str, Any]") -> "Dict[str, Any]":
        """Start the lazily started tools named in args["tools"] now (python: its interpreter's pid)."""
        names = args.get("tools") or []
        return {"python": self.python.warm()} if "python" in names else {}

    # The other tools are imported on first use: sandbox start-up time matters.
    @property
    def python(self) -> "Any":
        with self._lazy_lock:
            if self._python is None:
                from .tools.python_tool import PythonSession

                self._python = PythonSession(self.cwd, self.env, self.command_timeout,
                                             on_start=self.note_tools)
            return self._python

    @property
    def editor(self) -> "Any":
        with self._lazy_lock:
            if self._editor is None:
                from .tools.editor import Editor

                self._editor = Editor(self.cwd)
            return self._editor

    @property
    def files(self) -> "Any":
        with self._lazy_lock:
            if self._files is None:
                from .tools.files import Files

                self._files = Files(self.cwd)
            return self._files

    def interrupt(self, args: Dict[str, Any]) -> Dict[str, Any]:
        target = args.get("tool", "bash")
        if target == "bash":
            return self.bash.interrupt()
        if target == "python":
            return self._python.interrupt() if self._python is not None else {"interrupted": False}
        return {"error": "interrupt works on 'bash' or 'python', not %r" % target}

    def note_tools(self) -> None:
        """Record the tools' process groups next to the socket (host pids for `local`).

        Tools lead their own sessions, so killing a hung `local` server would not reach them;
        the host reads this file to kill them too. Inside a pid namespace it is unused.
        """
        groups = []
        for session in (self.bash, self._python):
            proc = getattr(session, "proc", None) if session is not None else None
            if proc is not None:
                started = _start_time(proc.pid)
                if started is not None:
                    groups.append([proc.pid, started])
        path = os.path.join(os.path.dirname(self.socket_path), "tools.json")
        try:
            with open(path + ".tmp", "w") as fh:
                json.dump(groups, fh)
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    def stop_tools(self) -> None:
        for session in (self.bash, self._python):
            if session is None:
                continue
            try:
                session.stop()
            except Exception:
                pass

    def exit(self, code: int) -> None:
        self.stop_tools()
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass
        os._exit(code)

    # -- serving ------------------------------------------------------------------
    def listen(self) -> None:
        old = os.umask(0o077)
        try:
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(self.socket_path)
        finally:
            os.umask(old)
        sock.listen(128)
        self.listener = sock

    def serve_forever(self) -> None:
        assert self.listener is not None
        while True:
            conn, _ = self.listener.accept()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            if not same_user(conn):
                conn.sendall(b'{"ok": false, "error": "connections from other users are refused"}\n')
                return
            first = reader.readline(4096)
            try:
                auth = json.loads(first).get("auth", "")
            except (ValueError, AttributeError):
                auth = ""
            if not hmac.compare_digest(str(auth), self.secret):
                conn.sendall(b'{"ok": false, "error": "authentication failed"}\n')
                return
            conn.sendall(b'{"ok": true}\n')
            while True:
                line = reader.readline(MAX_REQUEST_BYTES)
                if not line:
                    return
                reply = self.dispatch(line)
                conn.sendall(json.dumps(reply).encode() + b"\n")
                if reply.get("shutdown"):
                    self.exit(0)
        except (OSError, ValueError):
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def dispatch(self, line: bytes) -> Dict[str, Any]:
        try:
            request = json.loads(line)
            rid, tool, args = request.get("id"), request.get("tool"), request.get("args") or {}
        except (ValueError, AttributeError) as exc:
            return {"ok": False, "error": "bad request: %s" % exc}
        if tool == "shutdown":
            return {"id": rid, "ok": True, "result": {}, "shutdown": True}
        handler = self.tools.get(tool)
        if handler is None:
            return {"id": rid, "ok": False,
                    "error": "unknown tool %r; known: %s" % (tool, ", ".join(sorted(self.tools)))}
        try:
            result = handler(args)
        except Exception as exc:  # a tool bug must not take the server down
            result = {"error": "%s: %s" % (type(exc).__name__, exc)}
        return {"id": rid, "ok": True, "result": result}


def _start_time(pid: int) -> "Optional[int]":
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def same_user(conn: socket.socket) -> bool:
    """SO_PEERCRED: only our own user (as mapped into this namespace) may connect."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return True  # not available: the secret and the 0700 directory still protect us
    _, uid, _ = struct.unpack("3i", creds)
    return int(uid) == os.getuid()


def apply_limits(limits: Dict[str, int]) -> None:
    """Set soft = hard = value for each rlimit; never above an existing hard limit."""
    for name, value in limits.items():
        which = getattr(resource, name, None)
        if which is None or value is None:
            continue
        _, hard = resource.getrlimit(which)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        soft = value
        if name == "RLIMIT_CPU" and hard == resource.RLIM_INFINITY:
            # soft == hard would SIGKILL; a margin lets SIGXCPU arrive and be reported.
            value = soft + 2
        try:
            resource.setrlimit(which, (soft, value))
        except (ValueError, OSError) as exc:
            sys.stderr.write("exec server: cannot set %s=%s: %s\n" % (name, value, exc))


def main() -> None:
    config = json.loads(sys.stdin.readline())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    apply_limits(config.get("rlimits") or {})
    server = Server(config)
    signal.signal(signal.SIGTERM, lambda *_: server.exit(0))
    deadline = config.get("wall_clock_s")
    if deadline:
        # The sandbox's own wall-clock limit: when the server exits, bwrap's pid 1 ends
        # and the kernel kills everything left in the pid namespace.
        timer = threading.Timer(float(deadline), server.exit, args=(124,))
        timer.daemon = True
        timer.start()
    server.listen()
    sys.stdout.write("READY %d\n" % os.getpid())
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    if config.get("prestart_bash", True):
        threading.Thread(target=_prestart, args=(server.bash,), daemon=True).start()
    server.serve_forever()


def _prestart(bash: BashSession) -> None:
    # Warm the shell so that the first command does not pay bash's start-up.
    with bash.lock:
        if not bash.alive():
            try:
                bash.start()
            except Exception:
                pass


if __name__ == "__main__":
    main()
