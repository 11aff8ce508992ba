"""``elfes status --wait/--until``, printing side: the one loop that waits for runs (launcher/cli/main.py) and
for sweeps (launcher/cli/sweep.py) in turn, under one ``--timeout-s`` deadline, says why a wait fell short and
turns how each went into the exit code. The waiting itself is launcher/commands/status_wait.py's. Torch-free.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .exit_codes import EXIT_INTERRUPTED, EXIT_OK
from .output import print_error, print_line, shell_quoted


def wait_in_turn(
    folders: list[str],
    *,
    until_text: str | None,
    timeout_s: float | None,
    wait: Callable[..., Any],
    outcome: Callable[[Any, Any], int],
    waiting_for: Callable[[str], str],
    goes_on: str,
    check: Callable[[str], object] | None = None,
) -> int:
    """Wait for each of ``folders`` until ``until_text`` (``--until``; None: its end), all within ``timeout_s``.

    ``check(folder)`` runs for every folder before any wait (it raises to refuse one); ``wait(folder, until,
    deadline=)`` waits for one and returns how that went (``reached``, ``describe()``), which is printed when
    short of the point; ``outcome(until, waited)`` is that folder's exit code, and the first non-zero one is
    the command's. ``waiting_for(folder)`` names what a terminal is told is awaited; ``goes_on`` what goes on
    when Ctrl-C stops the wait (exit 130).
    """
    import time

    from ..commands.status_wait import Until
    from ..rundir.lookup import UsageError

    until = Until.parse(until_text or "ended")
    if timeout_s is not None and not timeout_s > 0:
        raise UsageError(f"--timeout-s {timeout_s:g}: give a number of seconds above 0")
    if check is not None:
        for folder in folders:
            check(folder)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    code = EXIT_OK
    for folder in folders:
        if sys.stderr.isatty():
            print(f"elfes: waiting until {waiting_for(folder)} is at {until}", file=sys.stderr, flush=True)
        try:
            waited = wait(folder, until, deadline=deadline)
        except KeyboardInterrupt:
            print_line(f"\nstopped waiting; {goes_on} (elfes status {shell_quoted(folder)})")
            return EXIT_INTERRUPTED
        if not waited.reached:
            print_error(waited.describe())
        code = code or outcome(until, waited)
    return code
