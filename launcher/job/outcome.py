"""What an attempt's end means (pure): finished, requeued, stopped, cancelled; and a command job's exit
code as a stop reason. Every rank computes the same decision from the same inputs, so every rank
takes the same action. Torch-free.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass

from .signals import TERMINATING_SIGNALS

# A stop reason the trainer sets on a normal end (the monitor stopped improving).
FINISHING_REASONS = ("early_stopping",)


@dataclass(frozen=True)
class Decision:
    """What an attempt's end means: its ``outcome`` (a ``state.OUTCOMES`` value), the signal behind it
    and, when a requeue was refused, why."""

    outcome: str
    signal: str | None = None
    error: str | None = None

    @property
    def requeue(self) -> bool:
        return self.outcome == "requeued"


def decide(
    stop_reason: str | None,
    *,
    requeue_signal_name: str,
    cancel_requested: bool,
    requeues_used: int,
    max_requeues: int,
) -> Decision:
    """The outcome of an attempt that returned with ``stop_reason`` (the reason all ranks agreed on).

    Every rank calls it with the same arguments, so every rank takes the same action. ``requeues_used``
    counts this attempt's own launch if it was a requeue. The cancel marker only tells a cancel from a
    stop: a requeue already agreed on goes ahead (the relaunch sees the marker and stops at once).
    """
    if stop_reason is None or stop_reason in FINISHING_REASONS:
        return Decision("finished")
    if stop_reason == requeue_signal_name:
        if requeues_used < max_requeues:
            return Decision("requeued", signal=stop_reason)
        return Decision(
            "stopped", signal=stop_reason,
            error=f"requeue limit reached ({requeues_used} of requeue.max_requeues={max_requeues} used); `last` is "
                  "saved: `elfes resume RUN_DIR` continues the run (raise requeue.max_requeues for more automatic requeues)",
        )
    name = stop_reason if stop_reason in TERMINATING_SIGNALS else None
    return Decision("cancelled" if cancel_requested else "stopped", signal=name)


def stop_reason_from_exit_code(returncode: int, *, stop_signal_names: Iterable[str]) -> str | None:
    """A command's exit code as a stop reason: 0 -> None (finished), 128 + a stop signal's number ->
    that signal's name (paused). Raises ``RuntimeError`` (the attempt failed) for anything else."""
    names = tuple(stop_signal_names)
    if returncode == 0:
        return None
    if returncode > 128:
        try:
            name = signal.Signals(returncode - 128).name
        except ValueError:
            name = None
        if name in names:
            return name
    if returncode < 0:
        name = signal.Signals(-returncode).name
        raise RuntimeError(
            f"the command was killed by {name} without saving; a command job must catch "
            f"{', '.join(names)} (e.g. StopRequest().catch_signals(signals=...)), save `last` and exit with "
            "128 + the signal's number"
        )
    raise RuntimeError(
        f"the command exited with code {returncode}; 0 means finished and 128 + the number of one of "
        f"{', '.join(names)} means paused after saving `last`; see its log for the error"
    )
