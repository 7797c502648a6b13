"""The one way the command line prints for people: our styles, never markup read from data.

rich reads `[...]` as markup and `:name:` as emoji codes by default, so a file named
`rows[train].jsonl`, a handler named `[/red]` or a message saying
`pip install 'hpc-rollout[agents]'` would lose words or crash the print itself. The consoles
here have both off: a string is printed exactly as it is. Styles are spans the code adds
around its own words (`styled`), so a message can join data and colour without either
reading the other. tests/core/test_console_text.py checks that no other module makes a
console or writes a markup tag.
"""

from __future__ import annotations

import enum
import os
import stat
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from orchestrator.report.durations import format_seconds

if TYPE_CHECKING:
    from rich.progress import TextColumn   # loaded with the first progress bar, not at start-up

__all__ = ["Tone", "make_console", "out", "err", "styled", "line", "say", "tell", "warn", "plain_column",
           "format_seconds", "detach_from_a_lost_terminal"]

# Wide when piped (a log file, `| less`): tables must not be cut to 80 columns.
PIPED_WIDTH = 200


class Tone(str, enum.Enum):
    """The few styles the command line uses, named by what they say."""

    ERROR = "red"
    WARNING = "yellow"
    STRONG = "bold"
    GOOD = "green"


def make_console(stderr: bool = False, **options: Any) -> Console:
    """A console that prints text as given: no markup, no emoji codes, no guessed highlighting."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if _isatty(stream) else PIPED_WIDTH
    settings: dict[str, Any] = {"markup": False, "emoji": False, "highlight": False, "soft_wrap": True,
                                "stderr": stderr, "width": width}
    return Console(**{**settings, **options})


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


out = make_console()
err = make_console(stderr=True)


def styled(text: str, tone: Tone) -> Text:
    """`text` in a style; whatever it holds stays literal."""
    return Text(text, style=tone.value)


def line(*parts: str | Text) -> Text:
    """One line from plain strings (printed as they are) and styled spans."""
    return Text.assemble(*parts)


def say(*parts: str | Text) -> None:
    """A line on standard output."""
    _print(out, line(*parts))


def tell(*parts: str | Text) -> None:
    """A line on standard error: progress, notes, anything that is not the command's result."""
    _print(err, line(*parts))


def warn(*parts: str | Text) -> None:
    tell(styled("warning:", Tone.WARNING), " ", *parts)


def _print(console: Console, text: Text) -> None:
    try:
        console.print(text)
    except OSError:   # the terminal went away (SIGHUP): the work goes on, unprinted
        pass


def plain_column(template: str, **options: Any) -> TextColumn:
    """A progress-bar column whose fields are printed as they are (rich reads markup in them otherwise)."""
    from rich.progress import TextColumn

    return TextColumn(template, markup=False, **options)


def detach_from_a_lost_terminal() -> None:
    """After SIGHUP: point stdout and stderr that were a terminal at /dev/null, so later prints
    neither fail (EIO) nor block; a pipe or a file keeps receiving. A hung-up terminal may no
    longer answer isatty(), so any character device counts."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(devnull, fd)
            except OSError:
                pass
    finally:
        os.close(devnull)
