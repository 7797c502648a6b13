"""The agents' channel: newline-delimited JSON over one TCP connection.

The listener writes its address into the meeting directory (atomically: the other agent never
reads half of it) and the other agent polls for it, opening the directory before each look so a
caching client finds the new name (fsops.refresh_dir). Only the meeting goes through the
filesystem under test; every measurement is timed against messages on this channel.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from orchestrator.errors import HpcRolloutError
from orchestrator.spool import fsops

ADDRESS_FILE = "listener.json"
MEET_TIMEOUT_S = 300.0


class DoctorError(HpcRolloutError, RuntimeError):
    """The agents could not meet or talk; the message says where it stopped."""


class Channel:
    def __init__(self, connection: socket.socket) -> None:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connection = connection
        self.reader = connection.makefile("rb")

    def send(self, message: dict[str, Any]) -> None:
        self.connection.sendall(json.dumps(message).encode() + b"\n")

    def receive(self, expected: str | None = None) -> dict[str, Any]:
        line = self.reader.readline()
        if not line:
            raise DoctorError("the other agent closed the connection (see its output)")
        message: dict[str, Any] = json.loads(line)
        if expected is not None and message.get("step") != expected:
            raise DoctorError(f"the agents fell out of step: expected {expected!r}, got {message.get('step')!r}")
        return message

    def step(self, name: str, **fields: Any) -> None:
        self.send({"step": name, **fields})

    def close(self) -> None:
        self.reader.close()
        self.connection.close()


def listen(meeting: Path, host: str) -> Channel:
    """Wait for the other agent, having told it where (the meeting directory)."""
    server = socket.create_server(("", 0))
    server.settimeout(MEET_TIMEOUT_S)
    port = server.getsockname()[1]
    fsops.write_atomic(meeting / ADDRESS_FILE, json.dumps({"host": host, "port": port}).encode())
    try:
        connection, _ = server.accept()
    except TimeoutError:
        raise DoctorError(f"no agent connected to {host}:{port} within {MEET_TIMEOUT_S:g} s") from None
    finally:
        server.close()
    connection.settimeout(None)
    return Channel(connection)


def connect(meeting: Path) -> Channel:
    """Find the listener's address in the meeting directory and connect."""
    deadline = time.monotonic() + MEET_TIMEOUT_S
    while True:
        fsops.refresh_dir(meeting)
        try:
            address = json.loads(fsops.read_bytes(meeting / ADDRESS_FILE))
            return Channel(socket.create_connection((address["host"], int(address["port"])), timeout=30))
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise DoctorError(f"no listener address appeared in {meeting} within {MEET_TIMEOUT_S:g} s, or it "
                                  "could not be reached (a firewall between the nodes?)") from None
            time.sleep(0.2)
