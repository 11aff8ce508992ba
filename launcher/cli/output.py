"""Printing for every verb: a line to stdout, an error to stderr, a path as a shell word."""

from __future__ import annotations

import shlex
import sys
from typing import Any


def print_line(text: str = "") -> None:
    print(text, flush=True)


def shell_quoted(path: Any) -> str:
    """A path as a shell word, for the commands the CLI suggests: ``'runs/my run'``."""
    return shlex.quote(str(path))


def print_error(message: str) -> None:
    print(f"elfes: error: {message}", file=sys.stderr, flush=True)
