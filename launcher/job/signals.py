"""The job's stop signals before the engine takes them over: which signals, flag-only handlers, and
whether another process catches a signal yet.

Inside the job, first act of every task: :class:`SignalFlags` replaces submitit's handlers (which would
checkpoint and exit inside the handler) with handlers that only record the signal. The main thread
acts on the record: it hands the signals to the engine's ``StopRequest`` once the engine is imported,
or forwards them to a command job's process. Torch-free.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from types import FrameType

from ..rundir.command_group import signal_masks
from ..submit.scripts import requeue_signal


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals the job turns into stops: SIGINT, SIGTERM and the requeue signal."""
    return tuple(dict.fromkeys((signal.SIGINT, signal.SIGTERM, requeue_signal())))


class SignalFlags:
    """Flag-only handlers installed first thing in the task. The main thread acts on ``received``.

    >>> flags = SignalFlags(stop_signals()).install()   # every rank, before anything slow  # doctest: +SKIP
    >>> flags.names()                                    # later, in the main thread  # doctest: +SKIP
    ['SIGUSR2']
    """

    def __init__(self, signals: Iterable[int]) -> None:
        self.signals = tuple(signal.Signals(signum) for signum in signals)
        self.received: list[signal.Signals] = []
        self._pid = os.getpid()

    def install(self) -> SignalFlags:
        for signum in self.signals:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None = None) -> None:
        if os.getpid() != self._pid:  # a forked child (DataLoader worker) inherited the handler: ignore
            return
        self.received.append(signal.Signals(signum))

    def names(self) -> list[str]:
        return [signum.name for signum in self.received]


def catches_signal(pid: int, signum: int) -> bool | None:
    """Whether process ``pid`` has a handler for ``signum`` (Linux ``/proc/PID/status`` ``SigCgt``); None
    when that cannot be read."""
    masks = signal_masks(pid)
    return None if masks is None else bool((masks[0] >> (int(signum) - 1)) & 1)
