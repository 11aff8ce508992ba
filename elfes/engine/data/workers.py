"""DataLoader worker processes that survive the job's stop signals, and shut down cleanly at exit."""

from __future__ import annotations

import atexit
import signal
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch.utils.data import DataLoader

from ..stop import stop_signals_in_use


def base_loader(loader: DataLoader[Any]) -> DataLoader[Any]:
    """The torch DataLoader under an accelerate-prepared one (itself for a plain loader)."""
    return getattr(loader, "base_dataloader", loader)


def iterate_sparing_workers(loader: DataLoader[Any]) -> Iterator[Any]:
    """Iterate ``loader`` so that its worker processes ignore the stop signals in use.

    SLURM signals every process of a job; a worker killed by it would crash the trainer instead of
    letting it stop at the next window boundary.
    """
    if not base_loader(loader).num_workers:  # no process to fork, no signal to spare
        yield from loader
        return
    signals = stop_signals_in_use()
    _ignore_stop_signals_in_workers(loader, signals)
    iterator = iter(loader)
    # Workers fork on the first fetch: block the stop signals meanwhile so that no worker can die of
    # one before its worker_init_fn has set it to ignore them.
    with _signals_blocked(signals):
        try:
            first = next(iterator)
        except StopIteration:
            return
    yield first
    yield from iterator


class IgnoreStopSignals:
    """A DataLoader ``worker_init_fn`` that makes workers ignore ``signals``, then runs the user's."""

    def __init__(self, user_init: Callable[[int], None] | None, signals: tuple[signal.Signals, ...]) -> None:
        self.user_init = user_init
        self.signals = signals

    def __call__(self, worker_id: int) -> None:
        for signum in self.signals:
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)
        if self.user_init is not None:
            self.user_init(worker_id)


def _ignore_stop_signals_in_workers(loader: DataLoader[Any], signals: tuple[signal.Signals, ...]) -> None:
    base = base_loader(loader)
    current = base.worker_init_fn
    if isinstance(current, IgnoreStopSignals):
        current.signals = signals
    else:
        base.worker_init_fn = IgnoreStopSignals(current, signals)
    if base.persistent_workers:
        _shut_down_at_exit(base)


# Persistent workers ignore SIGTERM, so multiprocessing's exit handler (which terminates daemon
# children with SIGTERM and then joins them) would wait for them forever. These loaders' workers
# are shut down the regular way (a sentinel on each queue) before that handler runs.
_persistent_loaders: weakref.WeakSet[DataLoader[Any]] = weakref.WeakSet()


def _shut_down_at_exit(loader: DataLoader[Any]) -> None:
    if not _persistent_loaders:
        atexit.register(shut_down_persistent_workers)  # runs before multiprocessing's (LIFO)
    _persistent_loaders.add(loader)


def shut_down_persistent_workers() -> None:
    """Stop the persistent workers of every loader the engine iterated; they restart on the next epoch."""
    for loader in list(_persistent_loaders):
        shut_down_workers(loader)


def shut_down_workers(loader: DataLoader[Any]) -> None:
    """Stop the persistent workers of ``loader``, if it has any running."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None
    _persistent_loaders.discard(loader)


@contextmanager
def _signals_blocked(signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
