"""``elfes submit --follow`` and ``elfes resume --follow``: the run shown live from its records and
``state.json`` (rich progress on a terminal, plain lines otherwise) until it ends. Printing only; the
watching itself is launcher/commands/logs.py's ``watch``. Part of the CLI (launcher/cli/main.py)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ..rundir.state import RunStatus
from .exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_RUN_FAILED, EXIT_RUN_STOPPED
from .output import print_line, shell_quoted


def _event_time(event: dict[str, Any]) -> datetime:
    try:
        return datetime.fromisoformat(str(event["time"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return datetime.now(timezone.utc)


def _state_lines(before: Any, after: Any) -> list[str]:
    """Human lines for what changed in state.json between two looks (attempts, requeues, status)."""
    if after is None:
        return []
    lines = []
    old = {attempt.number: attempt for attempt in (before.attempts if before is not None else ())}
    for attempt in after.attempts:
        previous = old.get(attempt.number)
        if previous is None and attempt.token != "submission":
            lines.append(f"attempt {attempt.number} started ({attempt.launch}) on {','.join(attempt.hosts) or '?'}, "
                         f"{after.executor} job {attempt.job_id}; requeues used {after.requeues_used} of "
                         f"{after.max_requeues}")
        if attempt.ended and (previous is None or not previous.ended):
            retried = attempt.failure is not None and attempt.failure.retried
            lines.append(f"attempt {attempt.number} ended {attempt.outcome}"
                         + (" (retrying)" if retried else "")
                         + (f" ({attempt.signal})" if attempt.signal else "")
                         + (f" at step {attempt.step}" if attempt.step is not None else "")
                         + (f": {attempt.error}" if attempt.error else ""))
    if before is None or before.status != after.status:
        last = after.last_attempt
        retrying = after.status == RunStatus.REQUEUED and last is not None and last.failure is not None and last.failure.retried
        lines.append(f"run {'failed (retrying)' if retrying else after.status}"
                     + (f" ({after.stopping_signal})" if after.stopping_signal else ""))
    return lines


def follow(run_dir: Any, *, from_start: bool) -> int:
    """Show the run live until it ends (``submit --follow``, ``resume --follow``); returns the exit code."""
    from rich.console import Console

    from elfes.records import EVENT_FIELDS
    from elfes.records.console import ConsoleDisplay

    from ..commands import logs

    console = Console(highlight=False)
    display = ConsoleDisplay(console, run_dir=run_dir)
    previous = None
    try:
        for snapshot in logs.watch(run_dir, from_start=from_start):
            for event in snapshot.events:
                if event.get("event") in EVENT_FIELDS:
                    display.show(event, _event_time(event))
            for line in _state_lines(previous, snapshot.state):
                console.out(f"elfes: {line}", highlight=False)
            previous = snapshot.state
            if snapshot.ended:
                break
    except KeyboardInterrupt:
        display.close()
        print_line(f"\nstopped following; the job keeps running (elfes status {shell_quoted(run_dir)}; elfes cancel {shell_quoted(run_dir)})")
        return EXIT_INTERRUPTED
    display.close()
    status = previous.status if previous is not None else "unknown"
    if status == RunStatus.FINISHED:
        return EXIT_OK
    if previous is not None and previous.error:
        print_line(f"error: {previous.error}")
    print_line(f"see: elfes logs {shell_quoted(run_dir)}" + ("" if status == RunStatus.FAILED else f"; continue: elfes resume {shell_quoted(run_dir)}"))
    return EXIT_RUN_FAILED if status == RunStatus.FAILED else EXIT_RUN_STOPPED
