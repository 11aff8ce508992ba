"""Printing for every verb: a line to stdout, an error to stderr, a path as a shell word."""

from __future__ import annotations

import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def print_line(text: str = "") -> None:
    print(text, flush=True)


def shell_quoted(path: Any) -> str:
    """A path as a shell word, for the commands the CLI suggests: ``'runs/my run'``."""
    return shlex.quote(str(path))


def table_console() -> Console:
    """The console of a table (``elfes status``, a sweep's): a terminal's width; to a file or pipe, COLUMNS
    where it is set, else wide enough for any table (the reader of a pipe decides how to wrap it)."""
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=False)  # rich takes its width from COLUMNS where set
    if console.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return console
    return Console(highlight=False, soft_wrap=False, width=10_000)


def print_error(message: str) -> None:
    print(f"elfes: error: {message}", file=sys.stderr, flush=True)
