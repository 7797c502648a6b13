"""One emulated node's view of the spool, then the node's program in it.

    unshare -m --propagation private python -m tests.fsrig.node BASE AT CLIENT_OPTIONS -- CMD...

Mounts an NFS-client view (tests/fsrig/nfsview.py: BASE at AT with CLIENT_OPTIONS such as
`acregmin=3,acdirmin=30,lookupcache=all,cto`) in this process's private mount namespace, waits
until it answers, then becomes CMD (exec: the pid the caller holds is the program's, so its
signals, SIGSTOP included, reach the program itself). The view is started with a parent-death
signal (SIGKILL) and in a session of its own: it outlives every signal sent to the program or its
process group (a SIGTERM must not take the filesystem away from a worker still shutting down),
and dies with the program, however that ends; the namespace goes with the last of them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
MOUNT_WAIT_S = 20.0


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_IGN)


def _view_mounted(at: str) -> bool:
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[:3] == ["nfsview", at, "fuse"] for line in mounts)


def mount_view(base: str, at: str, options: str) -> subprocess.Popen[bytes]:
    # libfuse 3 (Debian's fuse3): mfusepy would take libfuse 2 where both are installed, which refuses
    # to mount over a non-empty directory (`at` may be a bind of the server's directory already).
    view = subprocess.Popen([sys.executable, "-m", "tests.fsrig.nfsview", base, at, options],
                            env={**os.environ, "FUSE_LIBRARY_NAME": "fuse3"}, preexec_fn=_die_with_parent,
                            start_new_session=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + MOUNT_WAIT_S
    while not _view_mounted(at):   # not ismount(): `at` may be a mount already (a bind of the server's directory)
        if view.poll() is not None or time.monotonic() > deadline:
            view.kill()
            raise SystemExit(f"tests.fsrig.node: the view of {base} did not mount at {at} (exit {view.poll()})")
        time.sleep(0.01)
    return view


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") != 3:
        raise SystemExit(__doc__)
    base, at, options = argv[:3]
    mount_view(base, at, options)
    command = argv[4:]
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
