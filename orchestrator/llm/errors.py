"""The exceptions of the LLM layer; each message names the problem and the fix."""

from __future__ import annotations

from orchestrator.errors import HpcRolloutError


class LLMError(HpcRolloutError):
    """Base class of every error raised by orchestrator.llm."""


class RegistryError(LLMError):
    """The backend registry cannot be used as asked (bad URL, unknown backend, bad value)."""


class RegistryCorrupt(RegistryError):
    """backends.json exists but cannot be parsed: nothing is routed until it is repaired."""


class RegistryUntrusted(RegistryCorrupt):
    """backends.json may have been written by someone the run does not trust: never acted on."""


class NoBackendAvailable(LLMError):
    """The registry lists no backend in state `up` that this task may use."""


class BackendFailed(LLMError):
    """A backend did not answer usefully after retries (refused, timeout, 5xx, bad body)."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"backend {url}: {message}")
        self.url = url


class RequestRejected(LLMError):
    """The backend answered 4xx: the request itself is wrong, retrying elsewhere will not help."""


class ReloadUnsupported(LLMError):
    """The backend has no weight reload endpoint (or refused the checkpoint)."""


class AbortUnsupported(LLMError):
    """The backend has no route to abort the generations in flight (in-flight work then finishes as is)."""
