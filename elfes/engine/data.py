"""The training data stream: exact sharding checks, epoch-addressed shuffles, resumable positions.

The order of epoch ``e`` is a function of the run's data seed and ``e`` alone, never of how many
times the run was paused, and skipped batches of a mid-epoch resume are skipped in the sampler
(accelerate's ``skip_first_batches``), so their samples are never read.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.data_loader import skip_first_batches
from torch.utils.data import DataLoader, RandomSampler

from .collectives import every_rank_value
from .stop import stop_signals_in_use

_SEED_RANGE = 2**62


def check_process_group(accelerator: Accelerator) -> None:
    """Refuse a launch of several processes in which Accelerate formed no process group."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and accelerator.num_processes == 1:
        raise RuntimeError(
            f"This process was launched as one of WORLD_SIZE={launched} processes, but the Accelerator runs "
            "alone (num_processes=1), so every process would train and write its own copy of the run. On a "
            "machine without GPUs, create Accelerator(cpu=True) or set ACCELERATE_USE_CPU=1."
        )


def check_distributed_batching(accelerator: Accelerator, dataloader: DataLoader) -> None:
    """Refuse settings under which ranks would pad, split or drop training batches."""
    world = accelerator.num_processes
    if world == 1:
        return
    config = accelerator.dataloader_config
    if config.split_batches:
        raise ValueError(
            "Exact training needs whole batches per rank, but the Accelerator has split_batches=True. "
            "Create it with Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=False, "
            "even_batches=False))."
        )
    if config.even_batches:
        raise ValueError(
            "Exact training needs unpadded shards, but the Accelerator has even_batches=True (the default), "
            "which repeats samples to even out ranks. Create it with "
            "Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))."
        )
    if config.dispatch_batches:
        raise ValueError(
            "Exact training shards batches in the sampler, but the Accelerator has dispatch_batches=True. "
            "Create it with DataLoaderConfiguration(dispatch_batches=False)."
        )
    batches = len(dataloader)
    if batches % world:
        raise ValueError(
            f"The training DataLoader has {batches} batches, which {world} ranks cannot share equally "
            f"({batches} % {world} = {batches % world}). Change the dataset size, batch_size or drop_last so "
            f"that the number of batches is a multiple of {world}."
        )


def verify_rank_lengths(accelerator: Accelerator, prepared: DataLoader, total_batches: int) -> int:
    """Check that every rank holds the same number of batches; returns that number."""
    length = len(prepared)
    if accelerator.num_processes > 1:
        lengths: list[int] = every_rank_value(length, accelerator)
        if len(set(lengths)) != 1 or sum(lengths) != total_batches:
            raise ValueError(
                f"The prepared training DataLoader gives ranks {lengths} batches out of {total_batches}; exact "
                "training needs equal, complete shards. Use a plain map-style Dataset with a standard sampler."
            )
    return length


def give_shuffle_its_own_generator(dataloader: DataLoader) -> None:
    """Give a shuffling sampler a private generator before accelerate prepares the loader.

    Otherwise accelerate seeds one from the global torch RNG on several ranks but not on one, and
    the draw would shift every later random number (dropout included) by the world size. The
    generator's initial state is irrelevant: :class:`EpochData` reseeds it for every epoch.
    """
    sampler = _random_sampler(dataloader)
    if sampler is not None and sampler.generator is None:
        sampler.generator = torch.Generator()


class EpochData:
    """Builds the iterator of one epoch from a prepared DataLoader, at any batch position."""

    def __init__(self, prepared: DataLoader, data_seed: int) -> None:
        self.prepared = prepared
        self.data_seed = data_seed
        self._shuffle = _random_sampler(prepared)
        if self._shuffle is not None and self._shuffle.generator is None:
            raise RuntimeError("call give_shuffle_its_own_generator(dataloader) before preparing it")
        self._worker_seeds = torch.Generator()

    def batches(self, epoch: int, start: int) -> Iterator[Any]:
        """Yield the batches of ``epoch`` from per-rank index ``start`` on, loading none before it."""
        # Seeding the sampler and the worker base seed from (data_seed, epoch) keeps the order
        # independent of pauses and keeps iterator creation from drawing on the global torch RNG,
        # which dropout must find exactly where the checkpoint left it.
        if self._shuffle is not None:
            self._shuffle.generator.manual_seed((self.data_seed + 2 * epoch) % _SEED_RANGE)
        self._worker_seeds.manual_seed((self.data_seed + 2 * epoch + 1) % _SEED_RANGE)
        loader = self.prepared
        loader.iteration = epoch  # accelerate passes this to set_epoch of samplers and datasets
        if start:
            loader = skip_first_batches(loader, start)
        _base_loader(loader).generator = self._worker_seeds
        yield from iterate_sparing_workers(loader)


def iterate_sparing_workers(loader: DataLoader) -> Iterator[Any]:
    """Iterate ``loader`` so that its worker processes ignore the stop signals in use.

    SLURM signals every process of a job; a worker killed by it would crash the trainer instead of
    letting it stop at the next window boundary.
    """
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


def _base_loader(loader: DataLoader) -> DataLoader:
    return getattr(loader, "base_dataloader", loader)


def _random_sampler(loader: DataLoader) -> RandomSampler | None:
    """The RandomSampler behind a prepared loader, if it shuffles with one."""
    batch_sampler = loader.batch_sampler
    for candidate in (
        getattr(batch_sampler, "sampler", None),
        getattr(getattr(batch_sampler, "batch_sampler", None), "sampler", None),
        loader.sampler,
    ):
        if isinstance(candidate, RandomSampler):
            return candidate
    return None


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


def _ignore_stop_signals_in_workers(loader: DataLoader, signals: tuple[signal.Signals, ...]) -> None:
    base = _base_loader(loader)
    if not base.num_workers:
        return
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
_persistent_loaders: weakref.WeakSet[DataLoader] = weakref.WeakSet()


def _shut_down_at_exit(loader: DataLoader) -> None:
    if not _persistent_loaders:
        atexit.register(shut_down_persistent_workers)  # runs before multiprocessing's (LIFO)
    _persistent_loaders.add(loader)


def shut_down_persistent_workers() -> None:
    """Stop the persistent workers of every loader the engine iterated; they restart on the next epoch."""
    for loader in list(_persistent_loaders):
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        loader._iterator = None


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
