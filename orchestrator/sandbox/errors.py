"""The sandbox exception hierarchy: every message names the problem and the fix."""

from __future__ import annotations

from orchestrator.errors import HpcRolloutError


class SandboxError(HpcRolloutError):
    """Base class of every sandbox failure."""


class SandboxConfigError(SandboxError, ValueError):
    """An option is invalid (bad runtime name, limit out of range, missing image...)."""


class SandboxStartError(SandboxError):
    """The sandbox process failed to come up."""


class SandboxClosedError(SandboxError):
    """The sandbox is closed or its process is gone."""


class SandboxAttachError(SandboxError):
    """A descriptor cannot be re-attached (other node, closed, or its record is missing)."""
