"""The python tool: a persistent interpreter in a child process, with timeout and interrupt."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Optional

from .output import HeadTail
from .session import InterpreterSession

DEFAULT_TIMEOUT = 120.0
DEFAULT_MAX_OUTPUT = 32_000
INTERRUPT_GRACE = 2.0
REPL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_repl.py")


class PythonSession(InterpreterSession):
    def __init__(
        self, cwd: str, env: Dict[str, str], default_timeout: "Optional[float]" = None,
        on_start: "Optional[Callable[[], None]]" = None,
    ) -> None:
        super().__init__(cwd, env, default_timeout, DEFAULT_TIMEOUT, on_start)
        self.proc: "Optional[subprocess.Popen[bytes]]" = None
        self.req_w = -1
        self.res_r = -1
        self.buffer = b""
        self.capture = ""

    def start(self) -> None:
        req_r, self.req_w = os.pipe()
        self.res_r, res_w = os.pipe()
        fd, self.capture = tempfile.mkstemp(prefix=".hpc-python-", suffix=".out")
        self.proc = subprocess.Popen(
            # No -E/-s: PYTHONPATH and user site-packages count, as for python3 in bash.
            [sys.executable, "-u", REPL, str(req_r), str(res_w), self.capture],
            cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
            pass_fds=(req_r, res_w), start_new_session=True,
        )
        for used in (req_r, res_w, fd):
            os.close(used)
        self.buffer = b""
        if self.on_start is not None:
            self.on_start()

    def warm(self) -> int:
        """Start the interpreter now (it boots while the caller goes on); its pid."""
        with self.lock:
            if not self.alive():
                self.stop()
                self.start()
            assert self.proc is not None
            return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
            self.proc = None
        for fd in (self.req_w, self.res_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.req_w = self.res_r = -1
        if self.capture:
            try:
                os.unlink(self.capture)
            except OSError:
                pass
            self.capture = ""

    def _read_answer(self, deadline: float) -> "Optional[Dict[str, Any]] | str":
        """The next answer line, "timeout", or "eof"."""
        while b"\n" not in self.buffer:
            wait = deadline - time.monotonic()
            if wait <= 0 or self.interrupt_requested.is_set():
                return "timeout"
            ready, _, _ = select.select([self.res_r], [], [], min(wait, 0.25))
            if not ready:
                continue
            data = os.read(self.res_r, 65536)
            if not data:
                return "eof"
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        answer: Dict[str, Any] = json.loads(line)
        return answer

    def run(self, args: Dict[str, Any]) -> Dict[str, Any]:
        code = args.get("code")
        if not isinstance(code, str):
            return {"error": "python needs a 'code' string"}
        timeout = float(args.get("timeout") or self.default_timeout)
        max_output = int(args.get("max_output") or DEFAULT_MAX_OUTPUT)
        with self.lock:
            self.interrupt_requested.clear()
            restarted = False
            if not self.alive():
                self.stop()
                self.start()
            assert self.proc is not None
            os.write(self.req_w, (json.dumps({"code": code}) + "\n").encode())
            answer = self._read_answer(time.monotonic() + timeout)
            timed_out = answer == "timeout"
            interrupted = False
            if timed_out:
                interrupted = True
                timed_out = not self.interrupt_requested.is_set()
                self.interrupt_requested.clear()
                os.kill(self.proc.pid, signal.SIGINT)
                answer = self._read_answer(time.monotonic() + INTERRUPT_GRACE)
            if not isinstance(answer, dict):
                # Dead (eof) or deaf to SIGINT: restart, and say the state is gone.
                try:
                    code_ = self.proc.wait(timeout=1) if answer == "eof" else None
                except subprocess.TimeoutExpired:
                    code_ = None
                self.stop()
                restarted = True
                answer = {
                    "stdout": "", "stderr": "", "result": None,
                    "error": "the interpreter %s; a fresh one (empty state) starts next call"
                    % ("exited with %s" % code_ if code_ is not None else "ignored the interrupt and was killed"),
                }
            result: Dict[str, Any] = dict(answer)
            for key in ("stdout", "stderr"):
                sink = HeadTail(max_output)
                sink.add(result.get(key) or "")
                result[key] = sink.text()
                result[key + "_truncated"] = sink.truncated
            error = result.get("error") or ""
            result["limit"] = "memory" if "MemoryError" in error else None
            result.update(timed_out=timed_out, interrupted=interrupted, restarted=restarted)
            return result

    def interrupt(self) -> Dict[str, Any]:
        self.interrupt_requested.set()
        return {"interrupted": True}
