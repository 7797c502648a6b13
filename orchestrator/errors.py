"""The one base of every error the package expects (bad input, a missing tool, a busy lock...).

Its message names the problem and the fix, so the command line prints it as one line
(`cli/errors.py`); anything that is not an HpcRolloutError escaping a command is a bug. Each
subclass keeps the built-in base its callers already catch (ValueError, LookupError, OSError...)
as its second base.
"""

from __future__ import annotations


class HpcRolloutError(Exception):
    """An expected error: its message says what went wrong and how to fix it."""
