"""Refusals of launches and loader settings under which ranks would not train on exact, equal shards."""

from __future__ import annotations

import os
from typing import Any

from accelerate import Accelerator
from torch.utils.data import DataLoader, IterableDataset

from elfes.refusals import ConfigurationError, ConfigurationTypeError

from ..collectives import every_rank_value
from .state import is_stateful, stateful_parts


def check_process_group(accelerator: Accelerator) -> None:
    """Refuse a launch of several processes in which Accelerate formed no process group."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and accelerator.num_processes == 1:
        raise ConfigurationError(
            f"This process was launched as one of WORLD_SIZE={launched} processes, but the Accelerator runs "
            "alone (num_processes=1), so every process would train and write its own copy of the run. On a "
            "machine without GPUs, create Accelerator(cpu=True) or set ACCELERATE_USE_CPU=1."
        )


def check_distributed_batching(accelerator: Accelerator, dataloader: DataLoader[Any]) -> None:
    """Refuse settings under which ranks would pad, split or drop training batches."""
    world = accelerator.num_processes
    if world == 1:
        return
    config = accelerator.dataloader_config
    if config.split_batches:
        raise ConfigurationError(
            "Exact training needs whole batches per rank, but the Accelerator has split_batches=True. "
            "Create it with Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=False, "
            "even_batches=False))."
        )
    if config.even_batches:
        raise ConfigurationError(
            "Exact training needs unpadded shards, but the Accelerator has even_batches=True (the default), "
            "which repeats samples to even out ranks. Create it with "
            "Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))."
        )
    if config.dispatch_batches:
        raise ConfigurationError(
            "Exact training shards batches in the sampler, but the Accelerator has dispatch_batches=True. "
            "Create it with DataLoaderConfiguration(dispatch_batches=False)."
        )
    if isinstance(dataloader.dataset, IterableDataset):
        return  # each rank reads its own stream; verify_rank_lengths compares their lengths
    batches = len(dataloader)
    if batches % world:
        raise ConfigurationError(
            f"The training DataLoader has {batches} batches, which {world} ranks cannot share equally "
            f"({batches} % {world} = {batches % world}). Change the dataset size, batch_size or drop_last so "
            f"that the number of batches is a multiple of {world}; a run continued from a checkpoint keeps its data: "
            f"continue it on a number of ranks that divides {batches}."
        )


def verify_rank_lengths(
    accelerator: Accelerator, prepared: DataLoader[Any], total_batches: int | None, *, length: int | None = None
) -> int | None:
    """Check that every rank holds the same number of batches; returns that number.

    ``total_batches`` is the unsharded loader's length (the ranks' lengths must add up to it), or None
    for streams, each rank's own (``length``, None where a stream has no ``__len__``).
    """
    if total_batches is not None:
        length = len(prepared)
    if accelerator.num_processes > 1:
        lengths: list[int | None] = every_rank_value(length, accelerator)
        if total_batches is not None and (len(set(lengths)) != 1 or sum(rank_length or 0 for rank_length in lengths) != total_batches):
            raise ConfigurationError(
                f"The prepared training DataLoader gives ranks {lengths} batches out of {total_batches}; exact "
                "training needs equal, complete shards. Use a plain map-style Dataset with a standard sampler."
            )
        if total_batches is None and len(set(lengths)) != 1:
            raise ConfigurationError(
                f"The ranks' training streams have {lengths} batches per epoch; every rank must read the same "
                "number of batches per epoch (each rank's stream the same __len__), or every rank none (no __len__, "
                "an epoch that ends with the stream: single process only). Shard the stream evenly, e.g. with "
                "datasets.distributed.split_dataset_by_node over a number of shards divisible by the world size."
            )
    return length


def check_training_loader(accelerator: Accelerator, dataloader: DataLoader[Any]) -> None:
    """Refuse a training loader whose batches or state the engine could not reproduce."""
    if not isinstance(dataloader, DataLoader):
        raise ConfigurationTypeError(f"The training data is a {type(dataloader).__name__}; pass a torch.utils.data.DataLoader.")
    if getattr(dataloader, "in_order", True) is False:
        raise ConfigurationError(
            "The training DataLoader has in_order=False, which yields batches in the order its workers finish "
            "them, so no two runs see the same order. Build it with in_order=True (the default)."
        )
    streaming = isinstance(dataloader.dataset, IterableDataset)
    # A stateful loader saves its workers' states, but only a stream resumes from it (see .stream).
    if dataloader.num_workers and not (streaming and is_stateful(dataloader)):
        held = stateful_parts(dataloader)
        if held:
            names = " and ".join(f"its {name} ({type(part).__name__})" for name, part in held.items())
            fix = (
                "Read the stream with torchdata's StatefulDataLoader (or Accelerator(dataloader_config="
                "DataLoaderConfiguration(use_stateful_dataloader=True))), which saves the workers' states, or use "
                "num_workers=0." if streaming else "Use num_workers=0, or keep the state out of the workers."
            )
            raise ConfigurationError(
                f"The training DataLoader has {names} with state_dict(), but with num_workers="
                f"{dataloader.num_workers} that state lives in the worker processes (or runs ahead of the trained "
                f"batches by the prefetched ones), where a checkpoint cannot reach it. {fix}"
            )
