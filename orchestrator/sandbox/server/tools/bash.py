"""A persistent bash on a pty; completion is detected from a prompt carrying a nonce.

Each command is sent as ONE input line

    __hpc_seq=N; eval $'COMMAND, ANSI-C quoted' </dev/null

and PS1 expands to `<nonce>:N:$?;`, so the prompt that follows names both the command it
belongs to and its exit status. `eval` runs in the shell itself (cd and variables persist);
a syntax error or an unclosed quote inside it is an error with status 2 instead of a shell
waiting for more input; stdin from /dev/null means a command that reads input gets EOF
instead of hanging. The pty is in non-canonical mode, so there is no 4 KiB line limit on
commands (a long heredoc is fine). Job control is off, so ^C reaches the foreground command
while background jobs (which ignore SIGINT) keep running.
"""

from __future__ import annotations

import os
import re
import select
import signal
import time
from typing import TYPE_CHECKING

from .output import HeadTail, describe_exit
from .session import InterpreterSession

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional

try:  # mounted next to this package inside the sandbox; installed on the host
    from ptyprocess import PtyProcess
except ImportError:  # pragma: no cover - the runtime always provides it
    PtyProcess = None

DEFAULT_TIMEOUT = 120.0
DEFAULT_IDLE_TIMEOUT = 0.0   # 0: no no-output timeout unless asked for
DEFAULT_MAX_OUTPUT = 32_000
INTERRUPT_GRACE = 2.0


class BashError(Exception):
    pass


def ansi_c_quote(text: str) -> str:
    """$'...' quoting: one physical line, and no byte the tty would act on (^C, ^D, ^Z)."""
    out = []
    for char in text:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif char == "'":
            out.append("\\'")
        elif code < 32 or code == 127:
            out.append("\\x%02x" % code)
        else:
            out.append(char)
    return "$'" + "".join(out) + "'"


class BashSession(InterpreterSession):
    def __init__(
        self, cwd: str, env: Dict[str, str], default_timeout: "Optional[float]" = None,
        on_start: "Optional[Callable[[], None]]" = None,
    ) -> None:
        super().__init__(cwd, env, default_timeout, DEFAULT_TIMEOUT, on_start)
        self.proc: Any = None
        self.seq = 0
        self.nonce = ""
        self.pattern: "Optional[re.Pattern[str]]" = None
        self.pending = ""
        self.after_interrupt = False   # extra prompts may follow a ^C: not parse errors

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        if PtyProcess is None:
            raise BashError("ptyprocess is not importable inside the sandbox")
        self.nonce = "__hpc_" + os.urandom(6).hex()
        self.pattern = re.compile(re.escape(self.nonce) + r":(\d+):(\d+);")
        env = dict(self.env)
        env.update({"TERM": "dumb", "HISTFILE": "/dev/null"})
        self.proc = PtyProcess.spawn(
            ["bash", "--noprofile", "--norc", "--noediting", "-i"],
            cwd=self.cwd, env=env, echo=False, dimensions=(50, 250),
        )
        self.seq = 0
        self.pending = ""
        setup = (
            "stty -echo -icanon min 1 time 0 2>/dev/null; set +m; unset HISTFILE; PS2=''; __hpc_seq=0; "
            # PROMPT_COMMAND restores the marker prompt before every prompt, so commands
            # that change PS1 (`PS1=...`, a venv's activate script) cannot break completion.
            "__hpc_ps1='%s:${__hpc_seq}:$?;'; PS1=$__hpc_ps1; PROMPT_COMMAND='PS1=$__hpc_ps1; PS2='\n"
            % self.nonce
        )
        os.write(self.proc.fd, setup.encode())
        ok, _, _, _ = self._wait_prompt(0, HeadTail(4096), deadline=time.monotonic() + 10, idle=0)
        if not ok:
            self.stop()
            raise BashError("bash did not come up within 10 s")
        if self.on_start is not None:
            self.on_start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.isalive()

    def stop(self) -> None:
        if self.proc is None:
            return
        # SIGKILL the shell's whole session (ptyprocess made it a session leader); no
        # ptyprocess.close(force=True): it sleeps 100 ms after terminating.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.close(self.proc.fd)
        except OSError:
            pass
        if not getattr(self.proc, "terminated", False):
            try:
                os.waitpid(self.proc.pid, 0)
            except OSError:
                pass
        self.proc.closed = True
        self.proc = None

    # -- reading -----------------------------------------------------------------
    def _wait_prompt(
        self, seq: int, sink: HeadTail, deadline: float, idle: float
    ) -> "tuple[bool, Optional[int], bool, bool]":
        """Read until the prompt of command `seq`: (found, exit code, timed out, eof)."""
        assert self.pattern is not None
        fd = self.proc.fd
        last_output = time.monotonic()
        while True:
            match = self.pattern.search(self.pending)
            while match is not None:
                before = self.pending[: match.start()]
                self.pending = self.pending[match.end():]
                sink.add(before)
                if int(match.group(1)) == seq:
                    return True, int(match.group(2)), False, False
                if int(match.group(1)) < seq and not self.after_interrupt:
                    # Bash threw the whole input line away (a parse error such as an
                    # unclosed quote inside eval): the prompt still shows the old number.
                    sink.add("bash: the command could not be parsed (exit status 2)\n")
                    return True, 2, False, False
                match = self.pattern.search(self.pending)  # a stale prompt (after ^C)
            # Keep a possible partial prompt in `pending`, flush the rest.
            keep = len(self.nonce) + 24
            if len(self.pending) > keep:
                sink.add(self.pending[:-keep])
                self.pending = self.pending[-keep:]
            now = time.monotonic()
            wait = deadline - now
            if idle > 0:
                wait = min(wait, last_output + idle - now)
            if wait <= 0:
                return False, None, True, False
            ready, _, _ = select.select([fd], [], [], min(wait, 0.25))
            if self.interrupt_requested.is_set():
                return False, None, True, False
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                sink.add(self.pending)
                self.pending = ""
                return False, None, False, True
            last_output = time.monotonic()
            self.pending += data.decode("utf-8", "replace").replace("\r\n", "\n")

    # -- the tool ---------------------------------------------------------------
    def run(self, args: Dict[str, Any]) -> Dict[str, Any]:
        command = args.get("command")
        if not isinstance(command, str):
            return {"error": "bash needs a 'command' string"}
        timeout = float(args.get("timeout") or self.default_timeout)
        idle = float(args.get("idle_timeout") or DEFAULT_IDLE_TIMEOUT)
        max_output = int(args.get("max_output") or DEFAULT_MAX_OUTPUT)
        with self.lock:
            self.interrupt_requested.clear()
            if not self.alive():
                self.start()
            earlier = self._drain()
            self.seq += 1
            seq = self.seq
            sink = HeadTail(max_output)
            sink.add(earlier)
            text = "__hpc_seq=%d; eval %s </dev/null\n" % (seq, ansi_c_quote(command))
            try:
                os.write(self.proc.fd, text.encode())
            except OSError as exc:
                self.stop()
                return {"error": "the shell is gone (%s); it will restart on the next call" % exc}
            found, code, timed_out, eof = self._wait_prompt(
                seq, sink, time.monotonic() + timeout, idle
            )
            interrupted = False
            requested = self.interrupt_requested.is_set()
            if timed_out:
                interrupted = True
                found, code = self._interrupt(seq, sink)
            if eof:
                code = self._exit_status()
            if eof or not found:
                # The shell exited (e.g. `exit`) or ignored ^C: start a fresh one next time.
                self.stop()
            output = sink.text()
            sig, limit = describe_exit(code, output)
            result: Dict[str, Any] = {
                "output": output,
                "exit_code": code,
                "timed_out": timed_out and not requested,
                "interrupted": interrupted,
                "truncated": sink.truncated,
                "signal": sig,
                "limit": limit,
                "shell_restarted": eof or not found,
            }
            if eof:
                result["error"] = "the shell exited; a fresh shell (new state) starts on the next call"
            elif not found:
                result["error"] = "the command ignored ^C and was killed with its shell; state is lost"
            self.interrupt_requested.clear()
            return result

    def _drain(self) -> str:
        """Output that arrived between commands (a background job's), minus stale prompts."""
        data = b""
        while select.select([self.proc.fd], [], [], 0)[0]:
            try:
                chunk = os.read(self.proc.fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        text = self.pending + data.decode("utf-8", "replace").replace("\r\n", "\n")
        self.pending = ""
        self.after_interrupt = False
        assert self.pattern is not None
        return self.pattern.sub("", text)

    def _exit_status(self) -> Optional[int]:
        """The status of a shell that exited by itself (`exit 3` -> 3)."""
        try:
            _, status = os.waitpid(self.proc.pid, 0)
        except OSError:
            return None
        self.proc.terminated = True
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status)
        return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else None

    def _interrupt(self, seq: int, sink: HeadTail) -> "tuple[bool, Optional[int]]":
        """Send ^C, then wait briefly for the prompt of `seq` (the command's group ends)."""
        self.after_interrupt = True
        for _ in range(2):
            try:
                os.write(self.proc.fd, b"\x03")
            except OSError:
                return False, None
            self.interrupt_requested.clear()
            found, code, _, eof = self._wait_prompt(seq, sink, time.monotonic() + INTERRUPT_GRACE, 0)
            if found or eof:
                return found, code
        return False, None

    def interrupt(self) -> Dict[str, Any]:
        """Ask the running command (from another connection) to stop."""
        self.interrupt_requested.set()
        return {"interrupted": True}
