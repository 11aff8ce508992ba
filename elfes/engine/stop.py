"""Stopping a run at an optimizer-update boundary, from a signal or from code."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from signal import Signals
from types import FrameType

from elfes.contract import TERMINATING_SIGNALS

from .heartbeat import Heartbeat

DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A flag that asks the trainer to stop at the next window boundary and save ``last``.

    Any rank may call :meth:`request`; the trainer makes every rank agree at the same boundary.
    Handlers installed by :meth:`catch_signals` only set the flag: saving and communication happen
    in the training loop, never inside a signal handler. A second SIGINT while a stop is pending
    raises ``KeyboardInterrupt`` at once (nothing is saved); SIGTERM never escalates.

    >>> stop = StopRequest()
    >>> with stop.catch_signals():          # main thread of every rank  # doctest: +SKIP
    ...     state = trainer.train(config, checkpoint_dir=run_dir / "checkpoints", stop=stop)
    >>> stop.reason                         # e.g. "SIGTERM", or None when training ended normally

    ``heartbeat`` is where the trainer reports its progress (update boundaries, evaluation batches,
    checkpoint writes), for a watchdog in another thread (the launcher's hang watchdog reads it).
    """

    def __init__(self) -> None:
        self.heartbeat = Heartbeat()
        self._reason: str | None = None
        self._signal: str | None = None
        self._signals: tuple[signal.Signals, ...] = DEFAULT_SIGNALS

    @property
    def reason(self) -> str | None:
        """Why a stop was requested, or None while none was."""
        return self._reason

    @property
    def signal(self) -> str | None:
        """The name of the signal that requested the stop, if one did."""
        return self._signal

    @property
    def signals(self) -> tuple[Signals, ...]:  # `signal` in this class is the property above
        """The signals this request catches (and that DataLoader workers ignore while it is in use)."""
        return self._signals

    def request(self, reason: str) -> None:
        """Ask for a stop; the first reason wins. Safe to call from any rank, thread or handler."""
        if not isinstance(reason, str):
            raise TypeError(f"StopRequest.request(reason) needs a string; got {type(reason).__name__}.")
        if not reason:
            raise ValueError("StopRequest.request(reason) needs a non-empty reason, e.g. 'max_time'.")
        if self._reason is None:
            self._reason = reason

    def handle_signal(self, signum: int, frame: FrameType | None = None) -> None:
        """Record ``signum`` as a stop request: the handler :meth:`catch_signals` installs.

        A runtime that caught a signal before importing the engine hands it over with this.
        """
        name = signal.Signals(signum).name
        if self._reason is not None and name == "SIGINT" and self._signal == "SIGINT":
            raise KeyboardInterrupt("interrupted again: not saving")
        if self._reason is None:
            self._signal = name
        self.request(name)

    @contextmanager
    def catch_signals(self, signals: Iterable[int] = DEFAULT_SIGNALS) -> Iterator[StopRequest]:
        """Turn ``signals`` (SIGINT and SIGTERM by default) into stop requests while the block runs,
        then restore the old handlers.

        Call it from the main thread (Python delivers signals only there).

        >>> with stop.catch_signals(signals=(signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)):  # doctest: +SKIP
        ...     trainer.train(config, stop=stop)
        """
        chosen = tuple(dict.fromkeys(signal.Signals(signum) for signum in signals))
        if not chosen:
            raise ValueError("StopRequest.catch_signals(signals=...) needs at least one signal, e.g. signal.SIGTERM.")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "StopRequest.catch_signals() must run in the main thread, where Python delivers signals; "
                "call it around trainer.train(...) in the main thread of each process."
            )
        previous = {signum: signal.getsignal(signum) for signum in chosen}
        previous_set, self._signals = self._signals, chosen
        try:
            for signum in chosen:
                signal.signal(signum, self.handle_signal)
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._signals = previous_set


def decisive_reason(reasons: Iterable[tuple[str | None, str | None]]) -> tuple[str, str | None]:
    """The (reason, signal) all ranks adopt from each rank's own: a terminating signal (SIGTERM,
    SIGINT) wins over any other stop, such as a requeue signal; otherwise the first rank's."""
    requested = [(reason, name) for reason, name in reasons if reason is not None]
    return next(((r, s) for r, s in requested if s in TERMINATING_SIGNALS), requested[0])


def stop_signals_in_use() -> tuple[signal.Signals, ...]:
    """SIGINT and SIGTERM, plus every signal a :class:`StopRequest` catches in this process now.

    DataLoader workers ignore these: SLURM signals every process of a job, and a worker killed by
    the stop signal would crash the trainer instead of letting it stop at the window boundary.
    """
    caught = [
        signum
        for signum in sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})
        if getattr(signal.getsignal(signum), "__func__", None) is StopRequest.handle_signal
    ]
    return tuple(dict.fromkeys([*DEFAULT_SIGNALS, *caught]))
