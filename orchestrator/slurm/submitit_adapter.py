"""Every submitit name this project uses that is not submitit's public API, in one place.

submitit has no public call for "the batch script you would submit", and its SlurmExecutor
asks `srun` for the CPU affinity even when it only renders a script. These private uses are
checked against CHECKED_RANGE
(tests/core/test_submitit_adapter.py); pyproject.toml pins the same range, so a new
submitit is adopted only after the test passes on it.
"""

from __future__ import annotations

from submitit import SlurmExecutor
from submitit.core.utils import FailedJobError, FailedSubmissionError

CHECKED_RANGE = ">=1.5.4,<1.6"

__all__ = ["CHECKED_RANGE", "FailedJobError", "FailedSubmissionError", "OfflineExecutor",
           "SlurmExecutor", "submission_script"]


class OfflineExecutor(SlurmExecutor):
    """A SlurmExecutor that renders scripts on machines without srun (dry runs only)."""

    @classmethod
    def affinity(cls) -> int:   # private hook: the real one runs `srun` to count CPUs
        return 2


def submission_script(executor: SlurmExecutor) -> str:
    """The batch script text submitit would hand to sbatch for this executor's parameters."""
    return executor._make_submission_file_text(executor._submitit_command_str, "dry-run")
