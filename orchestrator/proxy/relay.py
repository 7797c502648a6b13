"""Inside the sandbox: a TCP relay on the sandbox's loopback to the job's proxy socket, and the
harness command run with OPENAI_BASE_URL / OPENAI_API_KEY and ANTHROPIC_BASE_URL /
ANTHROPIC_API_KEY pointing at it (the proxy serves both families of APIs).

    python3 relay.py --dir /.hpc-rollout/run/llm -- bash -c 'mini -m openai/policy ...'

Standard library only (it runs on whatever python3 the image has). The sandbox has no network,
so the relay listens on its own loopback (HPC_ROLLOUT_LOOPBACK when set, else 127.0.0.1) at a
free port, forwards every connection to DIR/proxy.sock, and exits with the command's status.
SIGINT/SIGTERM stop the command's whole process group. The token comes from DIR/token.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading

CHUNK = 65536
STOP_GRACE_S = 3.0


def pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((target, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def serve(listener: socket.socket, unix_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        # Answers may come in several writes (streamed chunks): Nagle's algorithm would hold each
        # next one back until the client's delayed ACK (up to 40 ms).
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(unix_path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="the proxy directory bound into the sandbox")
    parser.add_argument("--host", default=os.environ.get("HPC_ROLLOUT_LOOPBACK") or "127.0.0.1")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the harness command after --")
    with open(os.path.join(args.dir, "token")) as handle:
        token = handle.read().strip()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((args.host, 0))
    except OSError:  # the sandbox's own loopback address may not exist in a private network namespace
        listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    host, port = listener.getsockname()[:2]
    threading.Thread(target=serve, args=(listener, os.path.join(args.dir, "proxy.sock")), daemon=True).start()
    root = f"http://{host}:{port}"
    base = root + "/v1"
    # Anthropic clients append /v1/messages to their base URL themselves.
    env = dict(os.environ, OPENAI_BASE_URL=base, OPENAI_API_BASE=base, OPENAI_API_KEY=token,
               ANTHROPIC_BASE_URL=root, ANTHROPIC_API_KEY=token, HPC_ROLLOUT_LLM_URL=base)
    child = subprocess.Popen(command, env=env, start_new_session=True)

    def kill(sig: int) -> None:
        try:
            os.killpg(child.pid, sig)
        except OSError:
            pass

    def stop(signum: int, _frame: object) -> None:
        kill(signal.SIGTERM)   # then SIGKILL after a grace period, from a timer (not re-entering wait)
        timer = threading.Timer(STOP_GRACE_S, kill, args=(signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = child.wait()
    kill(signal.SIGKILL)   # what the command left running in its group goes with it
    listener.close()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
