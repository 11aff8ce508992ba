"""Model weights out of checkpoints: loading them into a model, exporting them as a plain state dict."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from elfes.files import atomic_writer
from elfes.refusals import ConfigurationError

from .checkpoint import CheckpointError, Weights, read_checkpoint


def checkpoint_weights(payload: Mapping[str, Any], weights: Weights, source: Path) -> dict[str, torch.Tensor]:
    """The plain model state dict of a checkpoint: raw weights, or EMA parameters with raw buffers. A sharded
    checkpoint's (a folder) are read from its shards, in this process alone."""
    if weights not in ("raw", "ema"):
        raise ConfigurationError(f"weights is {weights!r}; use 'raw' or 'ema'.")
    if source.is_dir():  # DCP, imported for a sharded checkpoint alone
        from .sharded import sharded_weights

        return sharded_weights(source, weights, payload)
    if weights == "raw":
        return dict(payload["model"])
    if payload.get("ema") is None:
        raise CheckpointError(
            f"{source} was written without EMA, so it has no 'ema' weights; ask for weights='raw', "
            "or train with ema_decay to have averaged weights."
        )
    return {**payload["model"], **payload["ema"]}


def load_weights(model: nn.Module, checkpoint: Path, *, weights: Weights = "raw") -> None:
    """Load a checkpoint's raw or EMA weights into an unwrapped, uncompiled model.

    No optimizer, DataLoader or process group is needed. ``checkpoint`` may be a file, a sharded
    checkpoint's folder (of any world size), or a pointer such as ``run_dir / "checkpoints" / "best"``.

    >>> load_weights(model, run_dir / "checkpoints" / "best", weights="ema")  # doctest: +SKIP
    >>> model = accelerator.prepare(model)  # doctest: +SKIP
    """
    source = Path(checkpoint)
    state = checkpoint_weights(read_checkpoint(source), weights, source.resolve())
    _check_unwrapped(model)
    model.load_state_dict(state)


def export_weights(checkpoint: Path, path: Path, *, weights: Weights = "raw") -> None:
    """Write a checkpoint's raw or EMA weights as a plain model state dict to ``path`` (atomically).

    >>> export_weights(run_dir / "checkpoints" / "best", run_dir / "model.pt", weights="ema")  # doctest: +SKIP
    >>> model.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))  # doctest: +SKIP
    """
    source = Path(checkpoint)
    save_state_dict(checkpoint_weights(read_checkpoint(source), weights, source.resolve()), Path(path))


def export_checkpoint(checkpoint: Path, path: Path) -> None:
    """Write a whole checkpoint to ``path`` (atomically) as one file that ``torch.load(weights_only=True)`` reads:
    a file as it is; a sharded folder, of any world size, read whole in this process: ``state.pt``'s entries, with
    the whole tensors of the shards under ``model`` and ``ema`` (by parameter name) and ``optimizer`` (by parameter
    index, then state name: its other values are under ``optimizer_values``, its hyperparameters under
    ``optimizer_groups``).

    >>> export_checkpoint(run_dir / "checkpoints" / "last", run_dir / "whole.pt")  # doctest: +SKIP
    >>> torch.load(run_dir / "whole.pt", weights_only=True)["optimizer"]["0"]["exp_avg"]  # doctest: +SKIP
    """
    source = Path(checkpoint).resolve()
    if source.is_dir():  # DCP, imported for a sharded checkpoint alone
        from .sharded import whole_sharded_checkpoint

        payload = whole_sharded_checkpoint(source)
    else:
        payload = read_checkpoint(source)
    save_state_dict(payload, Path(path))


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A model's state dict without DDP or torch.compile prefixes, cloned to the CPU."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}


def save_state_dict(state: Mapping[str, Any], path: Path) -> None:
    """Write a plain state dict (or payload) atomically (temporary name, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as stream:
        torch.save(dict(state), stream)


def _check_unwrapped(model: nn.Module) -> None:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) or hasattr(model, "_orig_mod"):
        raise TypeError(
            "load_weights needs the plain model: pass it before accelerator.prepare() or torch.compile(), "
            "then prepare or compile it."
        )
