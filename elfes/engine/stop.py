"""Stopping a run at an optimizer-update boundary, from a signal or from code."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

CAUGHT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A flag that asks the trainer to stop at the next window boundary and save ``last``.

    Any rank may call :meth:`request`; the trainer makes every rank agree at the same boundary.
    Handlers installed by :meth:`catch_signals` only set the flag: saving and communication happen
    in the training loop, never inside a signal handler.

    >>> stop = StopRequest()
    >>> with stop.catch_signals():          # main thread of every rank
    ...     state = trainer.train(config, checkpoint_dir=run_dir / "checkpoints", stop=stop)
    >>> stop.reason                         # e.g. "SIGTERM", or None when training ended normally
    """

    def __init__(self) -> None:
        self._reason: str | None = None
        self._signal: str | None = None

    @property
    def reason(self) -> str | None:
        """Why a stop was requested, or None while none was."""
        return self._reason

    @property
    def signal(self) -> str | None:
        """The name of the signal that requested the stop, if one did."""
        return self._signal

    def request(self, reason: str) -> None:
        """Ask for a stop; the first reason wins. Safe to call from any rank, thread or handler."""
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"StopRequest.request(reason) needs a non-empty string; got {reason!r}.")
        if self._reason is None:
            self._reason = reason

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._reason is None:
            self._signal = name
        self.request(name)

    @contextmanager
    def catch_signals(self) -> Iterator[StopRequest]:
        """Turn SIGINT and SIGTERM into stop requests while the block runs, then restore the old handlers.

        Call it from the main thread (Python delivers signals only there).
        """
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "StopRequest.catch_signals() must run in the main thread, where Python delivers signals; "
                "call it around trainer.train(...) in the main thread of each process."
            )
        previous = {signum: signal.getsignal(signum) for signum in CAUGHT_SIGNALS}
        try:
            for signum in CAUGHT_SIGNALS:
                signal.signal(signum, self._handle)
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
