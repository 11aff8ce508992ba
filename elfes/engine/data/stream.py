"""The training data as the engine reads it: prepared for the ranks, read without look-ahead, resumable.

The engine reads a batch only when the window needs it, never one ahead (accelerate's prepared loader
reads one batch ahead to know when an epoch ends), so the generator states a checkpoint holds are
those the next fetch starts from. A map-style dataset's batches are fetched under generators seeded
by the batch's place, in workers and in this process alike (:mod:`.fetch`). The order of epoch ``e``
is a function of the data seed and ``e`` alone.

A mid-epoch resume continues the data in the cheapest exact way the loader allows. A map-style
dataset skips the consumed batches in the sampler (nothing is read), unless the user's own sampler
keeps state, which is loaded instead; a stateful map-style dataset's state is loaded as well. A
stream loads its state from a stateful loader (torchdata's ``StatefulDataLoader``) or from the
dataset; a stream without state reads and discards the consumed batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, cast

import torch
from accelerate import Accelerator
from accelerate.data_loader import skip_first_batches
from accelerate.utils import send_to_device
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SubsetRandomSampler, WeightedRandomSampler

from elfes.contract import WarningKind

from ..rng import capture_rng, restore_rng
from .checks import check_distributed_batching, check_training_loader, verify_rank_lengths
from .fetch import PositionedBatches, with_seeded_fetches
from .prepare import prepare_data_loader
from .state import Stateful, is_stateful, stateful_parts, unsaved_shuffle_buffer
from .workers import base_loader, iterate_sparing_workers, shut_down_workers

_SEED_RANGE = 2**62

Warn = Callable[[WarningKind, str], None]
"""Says a warning (its kind, its message) to the user and to the run records."""


class TrainingData:
    """The training loader prepared for this rank; its checkpoint state is :meth:`state_dict`.

    ``batches_per_epoch`` is this rank's number of batches per epoch, or None for a stream without
    ``__len__`` (its epoch ends when the stream does).
    """

    def __init__(self, accelerator: Accelerator, dataloader: DataLoader[Any]) -> None:
        check_training_loader(accelerator, dataloader)
        check_distributed_batching(accelerator, dataloader)
        self.accelerator = accelerator
        self.streaming = isinstance(dataloader.dataset, IterableDataset)
        self.dataset_name = type(dataloader.dataset).__name__
        _give_shuffle_its_own_generator(dataloader)
        rebuilt = with_seeded_fetches(dataloader)
        self._positioned = rebuilt.batch_sampler if isinstance(rebuilt.batch_sampler, PositionedBatches) else None
        config = accelerator.dataloader_config
        # Only a stream resumes from a stateful loader's state: a map-style dataset skips in its sampler,
        # which is exact and cheap (torchdata's own resume re-draws a shuffle from a spent generator).
        self.stateful_loader = self.streaming and (is_stateful(dataloader) or bool(config.use_stateful_dataloader))
        state = accelerator.state
        # A stream is each rank's own (the user shards it); a map-style dataset is sharded by the sampler.
        ranks = (1, 0) if self.streaming else (state.num_processes, state.process_index)
        self.prepared = prepare_data_loader(
            rebuilt,
            device=accelerator.device,
            num_processes=ranks[0],
            process_index=ranks[1],
            split_batches=False,
            put_on_device=False,
            even_batches=False,
            use_stateful_dataloader=self.stateful_loader,
        )
        self.base = base_loader(self.prepared)
        self.parts = {} if self.stateful_loader else stateful_parts(dataloader)
        self._device = None if accelerator.device.type == "cpu" else accelerator.device
        self._non_blocking = bool(config.non_blocking)
        self._shuffle = _shuffling_sampler(self.prepared)
        self._worker_seeds = torch.Generator()
        self._saved: dict[str, Any] = {}
        self.batches_per_epoch = self._rank_length(dataloader)
        buffer = unsaved_shuffle_buffer(dataloader.dataset) if self.streaming else None
        self.setup_warnings: list[tuple[WarningKind, str]] = [] if buffer is None else [(WarningKind.INEXACT_STREAM, (
            f"The training stream ({self.dataset_name}) is shuffled with shuffle(buffer_size={buffer}), whose buffer "
            "its state_dict() leaves out: a resume in the middle of an epoch is not exact (it refills the buffer "
            "from the saved position, so other examples come in another order). For an exact resume shuffle the "
            "shards instead (the data files in a seeded order, no buffer), or shuffle in the sampler (a map-style "
            "dataset, load_dataset(...) without streaming, and DataLoader(shuffle=True))."))]

    def _rank_length(self, dataloader: DataLoader[Any]) -> int | None:
        if not self.streaming:
            return verify_rank_lengths(self.accelerator, self.prepared, len(dataloader))
        try:
            length = len(self.prepared)
        except TypeError:  # a stream without __len__
            length = None
        return verify_rank_lengths(self.accelerator, self.prepared, None, length=length)

    def per_rank_position(self) -> str | None:
        """What of this loader keeps a position per rank, which a run on another world size cannot take over
        (None for a map-style dataset read through the engine's sampler, whose position is the run's)."""
        if self.streaming:
            return f"the training stream ({self.dataset_name}) is read by each rank from its own share"
        kept = ["loader"] if self.stateful_loader else sorted(self.parts)
        return f"the training loader's {' and '.join(kept)} ({self.dataset_name}) keeps state" if kept else None

    # ----------------------------------------------------------------------------------------
    # Checkpoint state, per rank

    def state_dict(self) -> dict[str, Any]:
        """The state of each stateful part as the last trained batch left it (nothing is read ahead)."""
        if self.stateful_loader:
            return {"loader": cast(Stateful, self.base).state_dict()}  # a stateful loader (torchdata's)
        return {name: part.state_dict() for name, part in self.parts.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep ``state`` for the mid-epoch resume (at an epoch boundary every epoch starts afresh)."""
        self._saved = dict(state)

    # ----------------------------------------------------------------------------------------
    # Reading

    def batches(self, epoch: int, start: int, data_seed: int, warn: Warn) -> Generator[Any, None, None]:
        """Yield this rank's batches of ``epoch`` from index ``start`` on, each read when asked for; a resume
        that reads and discards the consumed batches of a stream says what it cost through ``warn``."""
        # Seeding the sampler and the workers' base seed from (data_seed, epoch) keeps the order
        # independent of pauses, and keeps iterator creation off the global torch generator.
        if self._shuffle is not None:
            self._shuffle.generator.manual_seed((data_seed + 2 * epoch) % _SEED_RANGE)
        self._worker_seeds.manual_seed((data_seed + 2 * epoch + 1) % _SEED_RANGE)
        if self._positioned is not None:
            self._positioned.start_epoch(data_seed, epoch)
        self.prepared.set_epoch(epoch)  # set_epoch of the sampler or the dataset, where they have one
        saved, self._saved = self._saved, {}
        loader, replay = self.base, 0
        if start:
            loader, replay = self._resume_at(epoch, start, saved)
        loader.generator = self._worker_seeds
        iterator = iterate_sparing_workers(loader)
        try:
            if replay:
                self._discard(iterator, epoch, replay, warn)
            if self._device is None:
                yield from iterator
            else:
                for batch in iterator:
                    yield send_to_device(batch, self._device, non_blocking=self._non_blocking)
        finally:
            if loader is not self.base and loader.persistent_workers:
                shut_down_workers(loader)  # the loader of a resumed epoch's rest: its workers are done

    def end_epoch(self, batches: Iterator[Any], epoch: int) -> None:
        """Ask ``batches`` (:meth:`batches` of ``epoch``, all of whose batches were read) for one more, as
        ``for batch in loader`` does: the code after the last item of a sampler or stream runs (a stream
        that rewinds its position there, a sampler that reshuffles), its workers end, and the checkpoint
        of this boundary holds what that code left. Nothing of the next epoch is read."""
        if next(batches, _END) is not _END:
            raise RuntimeError(
                f"The training DataLoader yielded more than the {self.batches_per_epoch} batches its length promised "
                f"in epoch {epoch}. Exact training reads each epoch to its end as a for loop does: give the dataset "
                "(or sampler) a __len__ that matches what it yields."
            )

    def _resume_at(self, epoch: int, start: int, saved: dict[str, Any]) -> tuple[DataLoader[Any], int]:
        """The loader that continues ``epoch`` at batch ``start``, and how many of its batches to discard."""
        if "loader" in saved and self.stateful_loader:
            cast(Stateful, self.base).load_state_dict(saved["loader"])
            return self.base, 0
        restored: set[str] = set()
        for name, part in self.parts.items():
            if name in saved:
                part.load_state_dict(saved[name])
                restored.add(name)
        if "sampler" in restored or (self.streaming and "dataset" in restored):
            if self._positioned is not None:  # the sampler yields from batch `start` on: its seeds must too
                self._positioned.continue_at(start * self.accelerator.num_processes)
            return self.base, 0
        if self.streaming:
            return self.base, start
        return base_loader(skip_first_batches(self.prepared, start)), 0

    def _discard(self, iterator: Iterator[Any], epoch: int, count: int, warn: Warn) -> None:
        """Read and drop the stream's first ``count`` batches, leaving this process's generators as they were."""
        epoch_number = epoch + 1  # messages count epochs from 1, as the run records do (a replay is mid-epoch)
        generators = capture_rng()
        started = time.perf_counter()
        try:
            for read in range(count):
                if next(iterator, _END) is _END:
                    raise RuntimeError(
                        f"The training stream ({self.dataset_name}) ended after {read} batches of epoch "
                        f"{epoch_number}, but the checkpoint was taken after batch {count}. Resume with the data the "
                        "run was trained on (a stream must yield the same batches when read again)."
                    )
        finally:
            restore_rng(generators)
        warn(WarningKind.STREAM_REPLAY, (
            f"Resumed the training stream ({self.dataset_name}) at batch {count} of epoch {epoch_number} by reading "
            f"and discarding the {count} batches before it ({time.perf_counter() - started:.1f} s). Exact, but "
            "slower the further into the epoch: give the dataset state_dict() and load_state_dict() (or read it "
            "with torchdata's StatefulDataLoader) to resume without reading them again."))


_END = object()


def _give_shuffle_its_own_generator(dataloader: DataLoader[Any]) -> None:
    """Give a shuffling sampler a private generator before accelerate prepares the loader.

    Otherwise accelerate seeds one from the global torch RNG on several ranks but not on one, and
    the draw would shift every later random number (dropout included) by the world size; and a
    sampler without one (``SubsetRandomSampler``, ``WeightedRandomSampler``) would draw its order
    from the global generator, whose state at a mid-epoch resume is not the epoch's start. The
    generator's initial state is irrelevant: :meth:`TrainingData.batches` reseeds it every epoch.
    """
    sampler = _shuffling_sampler(dataloader)
    if sampler is not None and sampler.generator is None:
        sampler.generator = torch.Generator()


def _shuffling_sampler(loader: DataLoader[Any]) -> Any:
    """The sampler behind a (prepared) loader that draws its order from a generator, if it has one.

    torch's ``RandomSampler``, ``SubsetRandomSampler`` and ``WeightedRandomSampler``, and torchdata's
    ``RandomSampler`` (what ``StatefulDataLoader(shuffle=True)`` builds; not a subclass of torch's).
    Each draws an epoch's order from ``sampler.generator`` when its iterator is made, so the order
    of epoch ``e`` depends on every earlier epoch's draw unless the generator is reseeded per epoch:
    a resumed run, whose sampler is new, would otherwise replay the first epoch's order.
    """
    batch_sampler = loader.batch_sampler
    for candidate in (
        getattr(batch_sampler, "sampler", None),
        getattr(getattr(batch_sampler, "batch_sampler", None), "sampler", None),
        loader.sampler,
    ):
        if isinstance(candidate, _SHUFFLING_SAMPLERS) or _torchdata_random_sampler(candidate):
            return candidate
    return None


_SHUFFLING_SAMPLERS = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def _torchdata_random_sampler(sampler: Any) -> bool:
    kind = type(sampler)
    return kind.__name__ == "RandomSampler" and kind.__module__.startswith("torchdata.stateful_dataloader")
