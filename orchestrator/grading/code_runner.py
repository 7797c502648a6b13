"""Runs graded code inside a grading sandbox. Standard library only: uploaded there and run by the
image's python3 with `-I`, so no module the graded code planted is ever imported here.

    python3 -I runner.py tests SPEC.json OUT_DIR    a code task's program on each test's input
    python3 -I runner.py checks SPEC.json OUT_DIR   a checker on (input, expected, output) triples
    python3 -I runner.py pytest SPEC.json OUT_DIR   a repository's tests under pytest

What the graded code can reach does not decide its grade (docs/agents.md, "Rewards a policy
cannot game"):
- SPEC is read and removed before anything runs; `tests` is given the inputs only: the worker
  compares the outputs with the expected ones, which never enter this sandbox;
- each run leads a session of its own under RLIMIT_AS / CPU / FSIZE (its output goes to a file
  the size limit caps) and a wall clock; after it, every process started since this runner
  began (a detached child, a daemon) is killed: before the next run, and before the result;
- this process is not dumpable: the code it runs cannot ptrace it or read its memory;
- OUT_DIR/result.json carries SPEC's nonce: a result written by anything else lacks it;
- pytest runs in a child (`pytest-child`) whose JUnit report goes to a pipe only this runner reads
  (a second writer adds a second XML document, which the worker refuses); pytest and its plugins
  are imported before the repository joins sys.path, so nothing in the repository stands in for
  them, and a session in which the repository's code rebound a function or class attribute of
  pytest or pluggy to code of its own ends before its report is written (TamperGuard).
"""

from __future__ import annotations   # annotations stay strings: any python3 in an image runs this

import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional

PR_SET_DUMPABLE = 4
REPORT_LIMIT = 64 << 20        # bytes of JUnit XML read from the pipe at most
TAIL_CHARS = 2000
GUARDED = ("_pytest", "pytest", "pluggy")
TAMPERED = 86                  # the exit status of a session whose pytest was tampered with


def limits(memory_mb: int, cpu_s: int, file_bytes: Optional[int] = None) -> Callable[[], None]:
    wanted = [(resource.RLIMIT_AS, memory_mb << 20), (resource.RLIMIT_CPU, cpu_s)]
    if file_bytes is not None:
        wanted.append((resource.RLIMIT_FSIZE, file_bytes))

    def apply() -> None:   # never above the sandbox's own hard limits, which cannot be raised
        for which, value in wanted:
            hard = resource.getrlimit(which)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            high = value + 1 if which == resource.RLIMIT_CPU and hard == resource.RLIM_INFINITY else value
            resource.setrlimit(which, (value, high))
    return apply


def not_dumpable() -> bool:
    """PR_SET_DUMPABLE 0: no ptrace, no /proc/PID/mem, fd or environ of this process for its children."""
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> Optional[list[str]]:
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()    # state, ppid, ...; starttime is [19]


def ancestors(pid: int) -> set[int]:
    found = {pid}
    while pid > 1:
        fields = _stat(pid)
        if fields is None:
            break
        pid = int(fields[1])
        found.add(pid)
    return found


class Reaper:
    """Kills every process started since this runner began, but the runner and its ancestors.

    Judged by start time, not by parentage: a child that left its session (setsid, a double fork)
    is found all the same. Only where the sandbox has a PID namespace of its own (`enabled`); the
    `local` runtime shares the host's, where this would reach the user's other processes.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        fields = _stat(os.getpid())
        self.since = int(fields[19]) if fields else 0
        self.keep = ancestors(os.getpid())
        self.killed = 0

    def leftovers(self) -> list[int]:
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in self.keep:
                continue
            fields = _stat(int(name))
            if fields is not None and fields[0] not in ("Z", "X") and int(fields[19]) >= self.since:
                found.append(int(name))
        return found

    def reap(self) -> None:
        for _ in range(200):        # a fork loop refills the list: kill until a pass finds nobody
            found = self.leftovers() if self.enabled else []
            if not found:
                return
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed += 1
                except OSError:
                    pass
            time.sleep(0.005)
        raise RuntimeError("processes of the graded code kept appearing; not all could be killed")


def read_spec(path: str) -> dict[str, Any]:
    with open(path) as fh:
        spec = json.load(fh)
    os.unlink(path)     # before anything runs: the graded code never sees it
    return spec


def session_run(command: list[str], stdin: bytes, timeout_s: float, workdir: str, reaper: Reaper, *,
                cwd: Optional[str] = None, preexec: Optional[Callable[[], None]] = None,
                pass_fds: tuple[int, ...] = ()) -> dict[str, Any]:
    """Run `command` (in `cwd`, else `workdir`) leading a session of its own, its stdout and stderr
    to fresh files in `workdir`; then reap whatever it left running."""
    out_fd, out_path = tempfile.mkstemp(dir=workdir)
    err_fd, err_path = tempfile.mkstemp(dir=workdir)
    started = time.monotonic()
    timed_out = False
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out_fd, stderr=err_fd, cwd=cwd or workdir,
                                start_new_session=True, preexec_fn=preexec, pass_fds=pass_fds)
    except OSError as exc:
        return {"exit_code": None, "error": str(exc), "ms": 0.0, "timed_out": False, "stdout": b"", "stderr": b""}
    finally:
        os.close(out_fd)
        os.close(err_fd)
    try:
        proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
    ms = round((time.monotonic() - started) * 1000, 3)
    reaper.reap()
    with open(out_path, "rb") as fh:
        stdout = fh.read()
    with open(err_path, "rb") as fh:
        stderr = fh.read()
    os.unlink(out_path)
    os.unlink(err_path)
    return {"exit_code": proc.returncode, "ms": ms, "timed_out": timed_out, "stdout": stdout, "stderr": stderr}


def run_test(spec: dict[str, Any], stdin: str, workdir: str, reaper: Reaper) -> dict[str, Any]:
    """One run of the program on one input: its status and output; `ran` means "compare the output"."""
    limit = float(spec.get("time_limit_s", 2))
    cap = int(spec.get("output_limit_bytes", 16 << 20))
    rundir = tempfile.mkdtemp(dir=workdir)
    done = session_run(list(spec["command"]), stdin.encode(), limit, workdir, reaper, cwd=rundir,
                       preexec=limits(int(spec.get("memory_mb", 512)), int(limit) + 1, cap))
    shutil.rmtree(rundir, ignore_errors=True)
    code, stderr = done["exit_code"], done["stderr"].decode("utf-8", "replace")[-500:]
    if code is None:
        return {"status": "runtime_error", "error": done["error"], "ms": 0.0}
    result: dict[str, Any] = {"ms": done["ms"]}
    if done["timed_out"] or code in (-signal.SIGKILL, -signal.SIGXCPU):   # the wall clock, RLIMIT_CPU
        return {**result, "status": "time_limit"}
    if code == -signal.SIGXFSZ or len(done["stdout"]) >= cap:
        return {**result, "status": "output_limit", "error": f"more than {cap} bytes of output"}
    if code != 0:
        status = "memory_limit" if "MemoryError" in stderr else "runtime_error"
        return {**result, "status": status, "exit_code": code, "error": stderr}
    return {**result, "status": "ran", "output": done["stdout"].decode("utf-8", "replace")}


def run_check(spec: dict[str, Any], case: dict[str, Any], workdir: str, reaper: Reaper) -> bool:
    """`python3 -I checker.py INPUT EXPECTED OUTPUT` exits 0 when OUTPUT is right."""
    rundir = tempfile.mkdtemp(dir=workdir)
    paths = []
    for name in ("checker.py", "input.txt", "expected.txt", "output.txt"):
        paths.append(os.path.join(rundir, name))
        with open(paths[-1], "w") as fh:
            fh.write(str(spec["checker"] if name == "checker.py" else case[name.split(".")[0]]))
    done = session_run([sys.executable, "-I"] + paths, b"", float(spec.get("time_limit_s", 30)), workdir, reaper,
                       cwd=rundir, preexec=limits(int(spec.get("memory_mb", 1024)), int(spec.get("time_limit_s", 30)) + 1))
    shutil.rmtree(rundir, ignore_errors=True)
    return done["exit_code"] == 0 and not done["timed_out"]


def _guarded(module: Any) -> bool:
    return str(module or "").split(".")[0] in GUARDED


def _origin(value: Any) -> Any:
    """The function behind a descriptor (pytest's legacypath plugin sets properties of its own)."""
    for attribute in ("fget", "__func__", "func"):
        inner = getattr(value, attribute, None)
        if callable(inner):
            return inner
    return value


def pytest_bindings() -> dict[tuple[str, str], Any]:
    """What pytest's and pluggy's modules and classes hold, by (owner, name)."""
    found: dict[tuple[str, str], Any] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not _guarded(name):
            continue
        for key, value in list(vars(module).items()):
            found[(name, key)] = value
            if isinstance(value, type) and _guarded(value.__module__):
                for attr, member in list(vars(value).items()):
                    found[(value.__module__ + "." + value.__qualname__, attr)] = member
    return found


class TamperGuard:
    """pytest's and pluggy's functions and classes as imported; after the tests, an attribute of
    theirs bound to code from elsewhere (`Function.runtest = lambda self: None`) means the graded
    code rewrote the runner: the session ends (TAMPERED) before its report is written."""

    def __init__(self) -> None:
        self.before = pytest_bindings()
        self.owners = {owner for owner, _ in self.before}

    def rebound(self) -> list[str]:
        found = []
        for (owner, name), value in pytest_bindings().items():
            if owner not in self.owners or self.before.get((owner, name), self) is value:
                continue
            if (callable(value) or isinstance(value, (property, staticmethod, classmethod))) \
                    and not _guarded(getattr(_origin(value), "__module__", None)):
                found.append(owner + "." + name)
        return found

    def pytest_sessionfinish(self, session: Any) -> None:   # tryfirst (pytest_child): before the JUnit report
        found = self.rebound()
        if found:
            sys.stderr.write("the graded code rebound pytest's %s: no report\n" % ", ".join(sorted(found)[:5]))
            sys.stderr.flush()
            os._exit(TAMPERED)


def pytest_child(args: list[str]) -> None:
    """In the child: pytest and its plugins, then the repository on sys.path, then the session.
    A repository that is pytest or pluggy itself is tested with its own code: no guard then."""
    import importlib

    own = any(os.path.isdir(os.path.join(os.getcwd(), *parts)) for parts in (
        ("_pytest",), ("src", "_pytest"), ("pluggy",), ("src", "pluggy")))
    if own:
        sys.path.insert(0, os.getcwd())
    import pytest
    from _pytest.config import default_plugins

    for name in default_plugins:
        try:
            importlib.import_module("_pytest." + name)
        except ImportError:
            pass
    hook = pytest.hookimpl(tryfirst=True)(TamperGuard.pytest_sessionfinish)
    TamperGuard.pytest_sessionfinish = hook  # type: ignore[method-assign]
    plugins = [] if own else [TamperGuard()]
    if not own:
        sys.path.insert(0, os.getcwd())
    sys.exit(pytest.main(args, plugins=plugins))


def run_pytest(spec: dict[str, Any], workdir: str, reaper: Reaper) -> dict[str, Any]:
    """pytest on the repository; its JUnit report read from a pipe (see the module's doc)."""
    read_end, write_end = os.pipe()
    chunks: list[bytes] = []

    def drain() -> None:
        size = 0
        while True:
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                return
            size += len(chunk)
            if size <= REPORT_LIMIT:
                chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    command = [sys.executable, "-I", "-B", os.path.abspath(__file__), "pytest-child", *spec["args"],
               "--junitxml=/dev/fd/%d" % write_end]
    done = session_run(command, b"", float(spec.get("timeout_s", 600)), workdir, reaper, cwd=str(spec["cwd"]),
                       pass_fds=(write_end,))
    os.close(write_end)       # every other writer is dead (reaped): the reader sees the end
    reader.join(30)
    report = b"".join(chunks)
    output = (done["stdout"] + done["stderr"]).decode("utf-8", "replace")[-TAIL_CHARS:]
    return {"exit_code": done["exit_code"], "timed_out": done["timed_out"], "ms": done["ms"],
            "tampered": done["exit_code"] == TAMPERED,
            "report": report.decode("utf-8", "replace"), "report_truncated": len(report) >= REPORT_LIMIT,
            "output": output}


def write_result(out_dir: str, result: dict[str, Any]) -> None:
    """A fresh OUT_DIR (whatever stood there removed) and result.json in it, created exclusively."""
    if os.path.islink(out_dir) or os.path.isfile(out_dir):
        os.unlink(out_dir)
    elif os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.mkdir(out_dir, 0o700)
    fd = os.open(os.path.join(out_dir, "result.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(result, fh)


def main() -> None:
    if sys.argv[1] == "pytest-child":
        pytest_child(sys.argv[2:])
    mode, spec_path, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    protected = not_dumpable()
    spec = read_spec(spec_path)
    reaper = Reaper(bool(spec.get("reap", True)))
    workdir = tempfile.mkdtemp(prefix="grading-")
    result: dict[str, Any] = {"nonce": spec["nonce"], "protected": protected}
    if mode == "tests":
        result["results"] = [run_test(spec, str(stdin), workdir, reaper) for stdin in spec["inputs"]]
    elif mode == "checks":
        result["accepted"] = [run_check(spec, case, workdir, reaper) for case in spec["cases"]]
    elif mode == "pytest":
        result.update(run_pytest(spec, workdir, reaper))
    else:
        raise SystemExit("mode must be tests, checks or pytest, not %r" % mode)
    reaper.reap()
    result["reaped"] = reaper.killed
    shutil.rmtree(workdir, ignore_errors=True)
    write_result(out_dir, result)


if __name__ == "__main__":
    main()
