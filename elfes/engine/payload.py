"""What a checkpoint payload may hold (what ``torch.load(weights_only=True)`` rebuilds), how a saved model's
parameters differ from a run's, and the error of a checkpoint that cannot be used."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from elfes.refusals import ConfigurationError

_PLAIN_TYPES = (str, bytes, int, float, bool, type(None), torch.Tensor, torch.Size, torch.dtype, torch.device)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, with the reason and what to do instead."""


class UnusableCheckpointError(CheckpointError, ConfigurationError):
    """A checkpoint no retry can use (damaged, not written by ELFES, or one whose layout or model does not fit this
    run, on any node alike): also a :class:`ConfigurationError`, so
    that the launcher ends the attempt instead of retrying from it (launcher/job/failures.py)."""


class ShardDamage(UnusableCheckpointError):
    """A shard file of a sharded checkpoint missing, cut short or with a failing checksum (a damaged folder, not a
    planted one): the caller names the checkpoint to use instead."""


TensorCopy = Callable[[torch.Tensor, str], torch.Tensor]  # (tensor, where in the payload) -> its copy


def model_mismatches(saved: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor]) -> list[str]:
    """Differences between a checkpoint's model and this run's, at most a few of each kind."""
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    common = set(saved) & set(current)
    reshaped = sorted(
        f"{name} {tuple(saved[name].shape)} -> {tuple(current[name].shape)}"
        for name in common
        if saved[name].shape != current[name].shape
    )
    retyped = sorted(
        f"{name} {saved[name].dtype} -> {current[name].dtype}" for name in common if saved[name].dtype != current[name].dtype
    )
    problems = []
    kinds = (("missing from the checkpoint", missing), ("unknown to this model", unexpected), ("reshaped", reshaped), ("of another dtype", retyped))
    for label, names in kinds:
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            problems.append(f"model parameters {label}: {shown}")
    return problems


def plain_payload(value: Any, where: str = "checkpoint", *, copy: TensorCopy | None = None) -> Any:
    """``value`` with NumPy scalars turned into Python numbers, or a ``TypeError`` naming the first
    field that ``torch.load(weights_only=True)`` could not load back (found at the save, not at the
    resume). Containers are rebuilt; with ``copy``, every tensor is replaced by ``copy(tensor, where)``."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:  # np.float64 is also a float
        return value.item()
    if isinstance(value, torch.Tensor) and copy is not None:
        return copy(value, where)
    if isinstance(value, _PLAIN_TYPES):
        return value
    if isinstance(value, Mapping):
        plain = {key: plain_payload(item, f"{where}[{key!r}]", copy=copy) for key, item in value.items()}
        return OrderedDict(plain) if isinstance(value, OrderedDict) else plain
    if isinstance(value, (list, tuple)):
        items = [plain_payload(item, f"{where}[{index}]", copy=copy) for index, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(
        f"{where} holds a {type(value).__module__}.{type(value).__qualname__}, which safe loading "
        "(torch.load(weights_only=True)) cannot rebuild, so this checkpoint could never be resumed. Keep only "
        "tensors, Python numbers, strings, lists and dicts in state_dict() (e.g. float(x) for a NumPy number)."
    )
