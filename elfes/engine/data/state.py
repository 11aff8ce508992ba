"""Which parts of a training loader carry state of their own, to be saved in every checkpoint."""

from __future__ import annotations

from typing import Any

from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler


def is_stateful(part: Any) -> bool:
    """Whether ``part`` offers ``state_dict()`` and ``load_state_dict()`` (torchdata's ``Stateful`` protocol)."""
    return callable(getattr(part, "state_dict", None)) and callable(getattr(part, "load_state_dict", None))


def stateful_parts(dataloader: DataLoader) -> dict[str, Any]:
    """The user's sampler (or batch sampler) and dataset that keep state, by name ("sampler", "dataset").

    torch's samplers, and the stateful copies of them that torchdata's loader makes, keep none that
    matters: their order is reseeded every epoch and a resume skips in them.
    """
    parts: dict[str, Any] = {}
    for candidate in (dataloader.batch_sampler, dataloader.sampler):
        if candidate is not None and not _plain(candidate) and is_stateful(candidate):
            parts["sampler"] = candidate
            break
    if is_stateful(dataloader.dataset):
        parts["dataset"] = dataloader.dataset
    return parts


def _plain(sampler: Any) -> bool:
    return type(sampler) in (BatchSampler, RandomSampler, SequentialSampler) or type(sampler).__module__.startswith(
        "torchdata.stateful_dataloader"
    )
