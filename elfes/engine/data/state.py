"""Which parts of a training loader carry state of their own, to be saved in every checkpoint."""

from __future__ import annotations

from typing import Any, Protocol, TypeGuard

from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler


class Stateful(Protocol):
    """A part that saves and restores its own state (torchdata's ``Stateful`` protocol)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def is_stateful(part: object) -> TypeGuard[Stateful]:
    """Whether ``part`` offers ``state_dict()`` and ``load_state_dict()`` (torchdata's ``Stateful`` protocol)."""
    return callable(getattr(part, "state_dict", None)) and callable(getattr(part, "load_state_dict", None))


def stateful_parts(dataloader: DataLoader[Any]) -> dict[str, Stateful]:
    """The user's sampler (or batch sampler) and dataset that keep state, by name ("sampler", "dataset").

    torch's samplers, and the stateful copies of them that torchdata's loader makes, keep none that
    matters: their order is reseeded every epoch and a resume skips in them.
    """
    parts: dict[str, Stateful] = {}
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


def unsaved_shuffle_buffer(dataset: Any) -> int | None:
    """The buffer size of a Hugging Face stream shuffled with ``shuffle(buffer_size=...)``, else None.

    Its ``state_dict()`` holds the position in the shards but not the buffer's examples, so a resume
    in the middle of an epoch refills the buffer from there: other examples in another order.
    """
    pending = [getattr(dataset, "_ex_iterable", None)]
    while pending:
        part = pending.pop()
        if part is None:
            continue
        if type(part).__name__ == "BufferShuffledExamplesIterable" and type(part).__module__.startswith("datasets."):
            return int(part.buffer_size)
        pending.append(getattr(part, "ex_iterable", None))
        pending.extend(getattr(part, "ex_iterables", None) or ())
    return None
