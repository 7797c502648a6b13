"""The registry's entries and their JSON: a backend, one consistent read of the file (Snapshot),
and the parsing of both (orchestrator/llm/registry.py reads and changes the file; its docstring
shows the format)."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from orchestrator.llm.errors import RegistryCorrupt, RegistryError
from orchestrator.llm.logprob_mode import LogprobMode, parse_logprob_mode, protocol_default
from orchestrator.spool.paths import current_node

FORMAT = 1


class Protocol(str, enum.Enum):
    VLLM = "vllm"
    SGLANG = "sglang"


class BackendState(str, enum.Enum):
    UP = "up"              # takes new tasks
    DOWN = "down"          # failed; skipped, probed again later
    DRAINING = "draining"  # no new tasks nor turns; a task on it moves to an up backend at its next turn


def parse_enum(kind: type[enum.Enum], value: str, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        options = ", ".join(m.value for m in kind)
        raise RegistryError(f"{what} {value!r} is not valid: use one of {options}") from None


def normalize_url(url: str) -> str:
    """`url` without trailing slash, or RegistryError saying what a valid one looks like."""
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:   # e.g. brackets that are not an IPv6 address
        raise RegistryError(f"backend URL {url!r} cannot be read ({exc}): e.g. http://node17:8000/v1") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RegistryError(
            f"backend URL {url!r} is not an http(s) URL with a host, e.g. http://node17:8000/v1"
        )
    if parts.query or parts.fragment:
        raise RegistryError(f"backend URL {url!r} must not carry a query or fragment")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise RegistryError(f"backend URL {url!r} has a bad port: {exc}") from None
    return url.strip().rstrip("/")


def node_of(url: str) -> str:
    """The node a backend runs on, from its host name (loopback means this node)."""
    host = urlsplit(url).hostname or ""
    return current_node() if host in ("localhost", "127.0.0.1", "::1") else host.split(".")[0]


@dataclass(frozen=True)
class Backend:
    url: str
    protocol: Protocol = Protocol.VLLM
    model: str | None = None          # served model id; asked from /v1/models when None
    tokenizer: str | None = None      # local tokenizer path; defaults to `model` when a directory
    policy_version: int = 0
    node: str = ""
    state: BackendState = BackendState.UP
    added_at: float = 0.0
    state_changed_at: float = 0.0
    reason: str = ""
    logprob_mode: LogprobMode | None = None   # None: the protocol's default (see served_logprobs)

    @property
    def served_logprobs(self) -> LogprobMode:
        """The logprobs this server returns: as recorded at `backend add`, else its protocol's default."""
        return self.logprob_mode or protocol_default(self.protocol.value)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["protocol"] = self.protocol.value
        data["state"] = self.state.value
        data["logprob_mode"] = self.logprob_mode.value if self.logprob_mode else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Backend":
        return cls(
            url=str(data["url"]),
            protocol=Protocol(data.get("protocol", "vllm")),
            model=data.get("model"),
            tokenizer=data.get("tokenizer"),
            policy_version=int(data.get("policy_version", 0)),
            node=str(data.get("node", "")),
            state=BackendState(data.get("state", "up")),
            added_at=float(data.get("added_at", 0.0)),
            state_changed_at=float(data.get("state_changed_at", 0.0)),
            reason=str(data.get("reason", "")),
            logprob_mode=parse_logprob_mode(data["logprob_mode"]) if data.get("logprob_mode") else None,
        )


@dataclass(frozen=True)
class Snapshot:
    """One consistent read of the registry."""

    policy_version: int = 0
    backends: tuple[Backend, ...] = ()
    updated_at: float = 0.0
    min_policy_version: int = 0      # samples of older policies are stale (orchestrator/spool/staleness.py)

    def find(self, url: str) -> Backend | None:
        return next((b for b in self.backends if b.url == url), None)

    def usable(self) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if b.state is BackendState.UP)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": FORMAT,
            "policy_version": self.policy_version,
            "updated_at": self.updated_at,
            "backends": [b.to_json() for b in self.backends],
        }
        if self.min_policy_version:
            data["min_policy_version"] = self.min_policy_version
        return data


def parse_snapshot(raw: bytes, path: Path) -> Snapshot:
    try:
        data = orjson.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("backends"), list):
            raise ValueError("expected an object with a 'backends' list")
        if data.get("format", FORMAT) != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this version reads {FORMAT}")
        backends = tuple(Backend.from_json(b) for b in data["backends"])
        return Snapshot(int(data.get("policy_version", 0)), backends, float(data.get("updated_at", 0)),
                        int(data.get("min_policy_version", 0)))
    except (ValueError, KeyError, TypeError, RegistryError) as exc:
        raise RegistryCorrupt(
            f"backend registry {path} is corrupt ({exc}); no task is routed until it is fixed (tasks wait "
            f"as in an outage, and workers move the file to quarantine/): `hpc-rollout backend add "
            f"{path.parent} URL` writes a new one (or `backend clear {path.parent} --force`)"
        ) from exc


def check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise RegistryError(f"policy version {version!r} must be an integer >= 0")
    return version
