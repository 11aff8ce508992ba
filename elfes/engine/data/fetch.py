"""Batches draw from generators seeded by the batch's place in the run, in DataLoader workers and in the
training process alike.

PyTorch seeds a worker's torch, NumPy and Python generators once, when the worker starts, and the
worker then fetches every ``num_workers``-th batch: the numbers a batch's random transforms draw
depend on which worker fetched it and on how many batches that worker fetched before. A restart in
the middle of an epoch starts fresh workers on the remaining batches, so every remaining batch
would draw other numbers. Here each batch's fetch in a worker (the dataset's reads and the collate
function together) runs under generators seeded from (data seed, epoch, batch index): the same
numbers whichever worker runs it, however far the loader has read ahead, and after any restart.

The batch index travels with the batch's indices from the sampler (in the training process) to the
worker: a :class:`PositionedBatch` is the list of indices with the seed of its fetch attached.

A batch fetched in the training process itself (no workers) draws torch's numbers the same way: its fetch
runs with torch's CPU generator seeded for the batch, then the generator is put back, so that the model's
draws (dropout) continue the rank's own stream. The batch's augmentation is then a function of its place
alone, as in a worker, whatever the world size and the number of workers: a run continued on another world
size reads every batch as the uninterrupted run did. (NumPy's and Python's generators are left to the
rank's stream there: saving and restoring NumPy's costs about 70 µs a batch; draw from torch, or read in
workers, for augmentation that a change of world size keeps.)

A stream has no indices: each item a worker reads is read under a seed from (the worker's seed, the
number of items it has read), and that count is part of the stream's state, so that a stateful
loader resumes each worker's seeds where they were.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from ..rng import seed_fetch_generators
from .state import Stateful, is_stateful

_MASK64 = 2**64 - 1
_SEED_BLOCK = 256  # batch seeds mixed at once


def fetch_seed(data_seed: int, epoch: int, index: int) -> int:
    """A 64-bit seed for the fetch of batch ``index`` of ``epoch`` (SplitMix64 over the three numbers)."""
    return batch_seed(epoch_seed(data_seed, epoch), index)


def epoch_seed(data_seed: int, epoch: int) -> int:
    """What :func:`fetch_seed` mixes from the data seed and the epoch: the same for every batch of the epoch."""
    return _splitmix64((_splitmix64(data_seed & _MASK64) ^ epoch) & _MASK64)


def batch_seed(epoch_seed: int, index: int) -> int:
    """:func:`fetch_seed` of batch ``index`` from its epoch's :func:`epoch_seed`."""
    return _splitmix64((epoch_seed ^ index) & _MASK64)


def batch_seeds(epoch_seed: int, first: int, count: int) -> list[int]:
    """:func:`batch_seed` of the ``count`` batches from index ``first`` on, mixed together: NumPy's uint64
    arithmetic wraps as the masks of :func:`_splitmix64` do, at a small share of its cost per batch."""
    value = np.arange(first, first + count, dtype=np.uint64) ^ np.uint64(epoch_seed)
    value += np.uint64(0x9E3779B97F4A7C15)
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    seeds: list[int] = (value ^ (value >> np.uint64(31))).tolist()
    return seeds


def _batch_seeds_from(epoch_seed: int, first: int) -> Iterator[int]:
    """:func:`batch_seed` of every batch from index ``first`` on, mixed a block at a time."""
    while True:
        yield from batch_seeds(epoch_seed, first, _SEED_BLOCK)
        first += _SEED_BLOCK


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


class PositionedBatch(list[Any]):
    """The sample indices of one batch, carrying the seed its fetch runs under (set after construction: list's
    own constructor, no Python frame per batch)."""

    __slots__ = ("seed",)
    seed: int

    @classmethod
    def of(cls, indices: Any, seed: int) -> PositionedBatch:
        batch = cls(indices)
        batch.seed = seed
        return batch

    def __reduce__(self) -> tuple[Any, ...]:  # sent to workers through a queue
        return PositionedBatch.of, (list(self), self.seed)


class PositionedBatches:
    """A batch sampler that tags each batch of the sampler it wraps with its fetch seed.

    The index counts batches of the unsharded sampler within the epoch, so it is unique across
    ranks. :meth:`start_epoch` is called before each epoch's iterator is made.
    """

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler
        self._epoch_seed = epoch_seed(0, 0)  # mixed once per epoch, not once per batch
        self._first_index = 0

    # accelerate's sampler lookup and its sharding read these of a batch sampler
    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def batch_size(self) -> int | None:
        return getattr(self.batch_sampler, "batch_size", None)

    @property
    def drop_last(self) -> bool:
        return bool(getattr(self.batch_sampler, "drop_last", False))

    def start_epoch(self, data_seed: int, epoch: int) -> None:
        self._epoch_seed, self._first_index = epoch_seed(data_seed, epoch), 0

    def continue_at(self, index: int) -> None:
        """The next iterator's first batch is batch ``index`` of the epoch (a sampler resumed from its own state)."""
        self._first_index = index

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[PositionedBatch]:
        first, self._first_index = self._first_index, 0
        for indices, seed in zip(self.batch_sampler, _batch_seeds_from(self._epoch_seed, first)):
            batch = PositionedBatch(indices)
            batch.seed = seed
            yield batch

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.batch_sampler, "set_epoch"):
            self.batch_sampler.set_epoch(epoch)


class SeededFetches(Dataset[Any]):
    """The user's map-style dataset, whose batch fetches (reads and collate) run under a batch's seed.

    ``__getitems__`` returns the collated batch: the loader it is given to collates with
    :func:`collated_already`. Attributes it lacks (``set_epoch``, ``state_dict``) are the dataset's.
    """

    def __init__(self, dataset: Dataset[Any], collate_fn: Callable[[list[Any]], Any]) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self._read_many = getattr(dataset, "__getitems__", None)  # looked up once: a miss raises inside getattr

    def __len__(self) -> int:
        return _length(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[Any]) -> Any:
        seed = getattr(indices, "seed", None)
        if seed is None:
            return self._fetch(indices)
        if get_worker_info() is not None:
            seed_fetch_generators(seed)
            return self._fetch(indices)
        generator = torch.default_generator
        rank_stream = generator.get_state()
        generator.manual_seed(seed)
        try:
            return self._fetch(indices)
        finally:
            generator.set_state(rank_stream)

    def _fetch(self, indices: list[Any]) -> Any:
        if self._read_many is not None:
            return self.collate_fn(self._read_many(list(indices)))
        dataset = self.dataset
        return self.collate_fn([dataset[index] for index in indices])

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "_read_many"):  # not yet set while unpickling in a worker
            raise AttributeError(name)
        return getattr(self.dataset, name)


class SeededStream(IterableDataset[Any]):
    """The user's stream, each item of which a worker reads under a seed from (worker seed, item count)."""

    def __init__(self, dataset: IterableDataset[Any]) -> None:
        self.dataset = dataset
        self.items_read = 0
        self._resume_at = 0

    def __len__(self) -> int:
        return _length(self.dataset)

    def __iter__(self) -> Iterator[Any]:
        worker = get_worker_info()
        items = iter(self.dataset)
        if worker is None:
            yield from items
            return
        count, self._resume_at = self._resume_at, 0
        self.items_read = count
        while True:
            # The worker's seed comes from the epoch's base seed (seeded from the data seed and epoch).
            seed_fetch_generators(fetch_seed(worker.seed, worker.id, count))
            try:
                item = next(items)
            except StopIteration:
                return
            count += 1
            self.items_read = count
            yield item

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not yet set while unpickling in a worker
            raise AttributeError(name)
        return getattr(self.dataset, name)


class StatefulSeededStream(SeededStream):
    """A :class:`SeededStream` over a stream with state: its state and each worker's item count."""

    def state_dict(self) -> dict[str, Any]:
        return {"dataset": cast(Stateful, self.dataset).state_dict(), "items_read": self.items_read}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        cast(Stateful, self.dataset).load_state_dict(state["dataset"])
        self._resume_at = state["items_read"]


def _length(dataset: Dataset[Any]) -> int:
    """``len(dataset)``, raising len's TypeError for a dataset without ``__len__``."""
    if not isinstance(dataset, Sized):
        raise TypeError(f"object of type '{type(dataset).__name__}' has no len()")
    return len(dataset)


def collated_already(batch: Any) -> Any:
    """The collate function of a loader over :class:`SeededFetches`, whose fetches collate themselves."""
    return batch


# The DataLoader arguments a rebuilt loader takes over from the user's (the batching ones are replaced).
_LOADER_ARGUMENTS = (
    "num_workers", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
    "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order", "snapshot_every_n_steps",
)


def with_seeded_fetches(loader: DataLoader[Any]) -> DataLoader[Any]:
    """``loader`` rebuilt (same class, same settings) so that its batches are fetched under seeds of the batch's
    place (a stream's items, in workers: of the item's); ``loader`` itself where there is nothing to seed (a
    stream read in the training process, no batch sampler)."""
    arguments = {name: getattr(loader, name) for name in _LOADER_ARGUMENTS if hasattr(loader, name)}
    if isinstance(loader.dataset, IterableDataset):
        if not loader.num_workers:
            return loader
        stream = StatefulSeededStream if is_stateful(loader.dataset) else SeededStream
        return type(loader)(
            stream(loader.dataset), batch_size=loader.batch_size, drop_last=loader.drop_last,
            collate_fn=loader.collate_fn, **arguments,
        )
    if loader.batch_sampler is None:
        return loader
    return type(loader)(
        SeededFetches(loader.dataset, loader.collate_fn),
        batch_sampler=PositionedBatches(loader.batch_sampler),
        collate_fn=collated_already,
        **arguments,
    )
