"""Errors of the Slurm integration; every message names the valid options where there are any."""

from __future__ import annotations

from orchestrator.errors import HpcRolloutError


class SlurmError(HpcRolloutError):
    """Base class: anything that went wrong talking to Slurm or preparing what it runs."""


class SlurmUnavailable(SlurmError):
    """No Slurm client commands on this machine (or the controller does not answer)."""


class SlurmClientMissing(SlurmUnavailable):
    """The client command is not on PATH: this machine has no Slurm at all."""


class SlurmCommandFailed(SlurmUnavailable):
    """A client command ran and exited non-zero; its exit status and stderr are kept."""

    def __init__(self, args: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"{' '.join(args)} failed ({returncode}): {stderr}")
        self.command = list(args)
        self.returncode = returncode
        self.stderr = stderr


class LaunchError(SlurmError):
    """A launch request is invalid or sbatch refused it."""


class TemplateError(SlurmError):
    """An sbatch template cannot be rendered with the given settings."""


class UnknownTemplate(TemplateError):
    def __init__(self, name: str, valid: list[str]) -> None:
        super().__init__(f"unknown sbatch template {name!r}; valid templates: {', '.join(valid)}")
        self.name = name
        self.valid = valid


class UnknownSetting(TemplateError):
    def __init__(self, template: str, keys: list[str], valid: list[str]) -> None:
        super().__init__(
            f"template {template!r} has no setting {', '.join(map(repr, keys))}; "
            f"valid settings: {', '.join(valid)}"
        )
        self.keys = keys
        self.valid = valid
