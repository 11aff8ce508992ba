"""A ``command:`` job inside the task: the command runs as a child process that owns its
``StopRequest``; the task forwards the stop signals to it and reads its exit code (0 finished,
128 + a stop signal's number paused, anything else failed). Torch-free.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from ..rundir.paths import RunPaths
from .outcome import stop_reason_from_exit_code
from .signals import SignalFlags, catches_signal

# A command job's child gets a stop signal once it catches it (it may be importing torch, when the
# default action would kill it), or after this long anyway.
FORWARD_HOLD_S = 60.0
# How often the waiting loop looks at its flags.
POLL_S = 0.05


def run_command(
    argv: list[str],
    *,
    paths: RunPaths,
    flags: SignalFlags,
    executor: str,
    started_at: str,
    watching: Callable[[Callable[[], str | None]], AbstractContextManager],
) -> tuple[str | None, int | None]:
    """Run ``argv`` to its end, forwarding stop signals; return (the stop reason, the step it saved).

    ``watching(probe)``: a context that marks the run "stopping" once ``probe`` names a signal (rank 0).
    """
    child = subprocess.Popen(argv, cwd=os.getcwd(), preexec_fn=_dies_with_parent())
    started = time.monotonic()
    forwarded = 0
    held: list[signal.Signals] = []
    with watching(lambda: flags.received[0].name if flags.received else None):
        while child.poll() is None:
            # The handlers only record; this loop forwards. A signal waits until the child catches it
            # (it may still be importing torch, when the default action would kill it), or FORWARD_HOLD_S.
            held += flags.received[forwarded:]
            forwarded = len(flags.received)
            held = [signum for signum in held if not _forward(child, signum, started, executor)]
            time.sleep(POLL_S)
    names = [signum.name for signum in flags.signals]
    # The exit code, not this task's own flags, decides: the children's trainer made every rank
    # agree on one stop reason, while each task may have seen other signals.
    reason = stop_reason_from_exit_code(child.returncode, stop_signal_names=names)
    return reason, saved_step_from_events(paths, started_at)


def _forward(child: subprocess.Popen, signum: signal.Signals, started: float, executor: str) -> bool:
    """Send ``signum`` to the command if it catches it by now (or waited too long); True once handled."""
    if signum == signal.SIGINT and executor == "slurm":
        return True  # SLURM signals every process of the step; a second SIGINT would interrupt the save
    if catches_signal(child.pid, signum) is False and time.monotonic() - started < FORWARD_HOLD_S:
        return False
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass
    return True


def saved_step_from_events(paths: RunPaths, since: str) -> int | None:
    """The step of the latest ``stopped``/``finished`` record written after ``since`` (a command job's
    own trainer wrote it), or None."""
    try:
        lines = paths.events.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill
        if event.get("event") in ("stopped", "finished") and str(event.get("time", "")) >= since:
            return (event.get("state") or {}).get("step")
    return None


def _dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the command's process get SIGTERM when this task dies (Linux
    ``PR_SET_PDEATHSIG``): a task killed by the local controller (or by hand) leaves no command behind."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the forked child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the task died before the call
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal

