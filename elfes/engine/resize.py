"""Continuing a run on another world size: what must stay, and how each rank's state is remapped.

An update sums over a window of world size x ``gradient_accumulation_steps`` microbatches; rank r reads the
epoch's batches r, r + world, r + 2 world, ... (accelerate's sharding of one sampler's order), so the window
of update k holds the epoch's batches [k x window, (k + 1) x window) whatever the world size. A run may
therefore continue on another world size when its window (and so every update's samples) stays: rank r of
the new size resumes at batch ``next_batch x old world / new world`` of its share. What no new rank can take
over is refused before training: a loader whose position is kept per rank (a stream read by each rank, a
stateful sampler, dataset or loader). Each rank's generators start from a stream derived from (data seed,
step, rank), since the old ranks' streams have no place in the new layout; but a generator that every old rank
had in the same state, every new rank takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from elfes.world_size import describe, window

from .data.fetch import fetch_seed
from .events import LogInterval

# Mixed into the stream seed of a rank after a resize, so that it never equals a batch's fetch seed.
_RANK_STREAM = 0x52414E4B
# Mixed into the data seed, so that a microbatch's model draws never reuse the numbers of its batch's fetch.
_MODEL_STREAM = 0x4D4F44454C


def shared_generators(states: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
    """The generators (by name, :data:`~elfes.engine.rng.GENERATORS`) that every old rank saved in the same state
    (``states``: each old rank's): a job that seeds every rank alike and draws alike from one (Python's, for a layer
    drop under FSDP2, which every rank must drop together) keeps that on the new world size. Empty when nothing was
    saved."""
    saved = [state or {} for state in states]

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return a.shape == b.shape and bool(torch.equal(a, b))
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return bool(a == b)

    return {name: state for name, state in saved[0].items()
            if all(name in other and same(state, other[name]) for other in saved[1:])}


def rank_stream_seed(payload: Mapping[str, Any], rank: int) -> int:
    """The seed of rank ``rank``'s generators after a resize: from (data seed, step, rank)."""
    return fetch_seed(int(payload["progress"]["data_seed"]) ^ _RANK_STREAM, int(payload["state"]["step"]), rank)


def remap_log_interval(interval: LogInterval, states: Sequence[Mapping[str, Any]], rank: int) -> None:
    """Load the statistics every old rank gathered since the last ``train`` record into rank 0 of the new world
    size, and none into the others (the record sums over ranks); the interval's counts, gradient norms and
    learning rates are global, the same on every old rank, and every new rank takes them."""
    interval.load_state_dict(states[0])
    if rank != 0:
        interval.metrics.reset()
        return
    for state in states[1:]:
        other = type(interval)(list(state["learning_rates"]), interval.device)
        other.load_state_dict(state)
        interval.metrics.merge(other.metrics)


def next_batch_after_resize(next_batch: int, found: Mapping[str, Any], world: int) -> int:
    """The batch of its share where a rank of the new world size resumes the epoch."""
    consumed = next_batch * int(found["world_size"])  # batches of the epoch that every rank together read
    return consumed // world  # a whole number of windows (or the epoch's start): check_fits admitted the window


def resize_warning(found: Mapping[str, Any], expected: Mapping[str, Any], model_randomness: str) -> str | None:
    """What a run continued on another world size keeps, and what it cannot (``model_randomness``: the
    TrainConfig's); None on the same world size."""
    if found["world_size"] == expected["world_size"]:
        return None
    generators = (
        "every microbatch's torch draws (dropout) stay those of its batch (TrainConfig.model_randomness='per_batch'), "
        "while NumPy's and Python's draws in the training process start"
        if model_randomness == "per_batch" else
        "each rank's generators (dropout, and NumPy's or Python's draws while reading batches in the training "
        "process) start")
    return (
        f"Continuing on {describe(expected)} a run whose checkpoint was written on {describe(found)}: every update "
        f"trains on the same {window(found)} microbatches as before, but the sum over ranks is reduced in another "
        f"order, so the run now matches an uninterrupted one to float rounding, not bitwise; and {generators} "
        "from new streams derived from (seed, step, rank), except a generator that every old rank had in the same "
        "state, which every new rank then takes. The CPU draws of torch while reading a batch, in DataLoader workers or not, and every "
        "draw in workers, stay those of the batch.")


class BatchKeyedRandomness:
    """``TrainConfig(model_randomness="per_batch")``: torch's generators of this process (the CPU one, and the
    CUDA device's the model runs on) are seeded before each microbatch's step from (data seed, epoch, the batch's
    index in the epoch over all ranks). Rank ``rank`` reads the epoch's batches ``rank``, ``rank + world``, ...,
    so a batch draws the same dropout whichever rank reads it, on any world size, and after any resume."""

    def __init__(self, data_seed: int, rank: int, world_size: int, device: torch.device) -> None:
        self.data_seed = data_seed ^ _MODEL_STREAM
        self.rank = rank
        self.world_size = world_size
        self.generators = [torch.default_generator]
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.generators.append(torch.cuda.default_generators[index])

    def seed(self, epoch: int, batch: int) -> None:
        """Seed for batch ``batch`` of this rank's share of epoch ``epoch``."""
        seed = fetch_seed(self.data_seed, epoch, batch * self.world_size + self.rank)
        for generator in self.generators:
            generator.manual_seed(seed)
