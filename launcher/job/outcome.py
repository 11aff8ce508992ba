"""What an attempt's end means (pure): finished, requeued, stopped, cancelled; and a command job's exit
code as a stop reason. Every rank computes the same decision from the same inputs, so every rank
takes the same action. Torch-free.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from elfes.contract import FINISHING_REASONS, TERMINATING_SIGNALS

from ..rundir.state import Outcome


@dataclass(frozen=True)
class Decision:
    """What an attempt's end means: its ``outcome``, the signal behind it and, when a requeue was refused, why."""

    outcome: Outcome
    signal: str | None = None
    error: str | None = None

    @property
    def requeue(self) -> bool:
        return self.outcome == Outcome.REQUEUED


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
        return Decision(Outcome.FINISHED)
    if stop_reason == requeue_signal_name:
        if requeues_used < max_requeues:
            return Decision(Outcome.REQUEUED, signal=stop_reason)
        return Decision(
            Outcome.STOPPED, signal=stop_reason,
            error=f"requeue limit reached ({requeues_used} of requeue.max_requeues={max_requeues} used); `last` is "
                  "saved: `elfes resume RUN_DIR` continues the run (raise requeue.max_requeues for more automatic requeues)",
        )
    name = stop_reason if stop_reason in TERMINATING_SIGNALS else None
    return Decision(Outcome.CANCELLED if cancel_requested else Outcome.STOPPED, signal=name)


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


@dataclass(frozen=True)
class Delivery:
    """A stop signal the task received (``requested``) and what it sent the command's group for it
    (``sent``: the same, or SIGTERM standing in for a requeue signal the command does not catch)."""

    requested: str
    sent: str


def command_stop_reason(
    exit_code: int,
    *,
    stop_signal_names: Iterable[str],
    delivered: Sequence[Delivery] = (),
    held: Sequence[str] = (),
    records_finished: bool = False,
    kill_wait_s: int | None = None,
) -> tuple[str | None, str | None]:
    """A command's exit code as (the stop reason, a note for the attempt's record), after the task sent
    the command ``delivered`` and held ``held`` back (signals the command never caught).

    * 128 + a sent signal's number: paused on that signal; on SIGTERM that stood in for the requeue
      signal, the requeue that was asked for.
    * 0 after a delivered stop: finished only when the run's records say it finished (``records_finished``);
      otherwise the stop's outcome, with a note naming the protocol.
    * killed by a terminating stop signal it was sent (or that SLURM sent it), not caught: the stop.
    * killed by SIGKILL after ``kill_wait_s`` (the task escalated a stop the command outlived): the stop.
    * anything else: ``RuntimeError`` (see :func:`stop_reason_from_exit_code`).
    """
    names = tuple(stop_signal_names)
    requests = [delivery.requested for delivery in delivered]
    if exit_code == 0:
        if requests and not records_finished:
            sent = delivered[0].sent
            return requests[0], (
                f"the command exited 0 after {sent}, but the run's records (events.jsonl) do not say it finished: "
                f"counted as the stop ({requests[0]}). A command job exits 128 + the signal's number "
                f"({128 + signal.Signals[sent]} for {sent}) after saving `last` on a stop signal, and 0 only "
                "when training is done")
        if held and not requests:
            return None, (f"{held[0]} was never delivered: the command caught neither {held[0]} nor SIGTERM before "
                          "it ended by itself (exit 0); a command job catches the stop signals as soon as it starts")
        return None, None
    if exit_code > 128:
        name = _signal_name(exit_code - 128)
        stood_in = [d.requested for d in delivered if d.sent == name and d.requested != name]
        if name in names and stood_in and name not in requests:
            return stood_in[0], None  # SIGTERM delivered for the requeue signal: the requeue goes ahead
    if exit_code < 0 and (name := _signal_name(-exit_code)) in TERMINATING_SIGNALS and name in (
            [d.sent for d in delivered] + list(held)):
        # Killed by the stop signal itself (its default action): the stop, without a save.
        return name, (f"the command did not catch {name} and was killed by it: work since `last` is lost (a command "
                      f"job catches {name}, saves `last` and exits {128 + signal.Signals[name]})")
    if kill_wait_s is not None and exit_code == -signal.SIGKILL and requests:
        stop = next((name for name in requests if name in TERMINATING_SIGNALS), requests[0])
        return stop, (f"the command did not exit within resources.kill_wait_s={kill_wait_s} s of "
                      f"{delivered[0].sent} and was killed (SIGKILL): work since `last` is lost")
    return stop_reason_from_exit_code(exit_code, stop_signal_names=names), None


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None
