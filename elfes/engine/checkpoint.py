"""The checkpoint format and its directory: atomic files, pointer symlinks, retention, loading.

One checkpoint is one complete PyTorch file, ``step-<step>-batches-<batches>.pt``, written under a
temporary name in the same folder, fsynced, renamed into place, and the folder fsynced. ``last``,
``best`` and ``final`` are relative symlinks, each replaced by renaming a new link over the old one,
so a reader (or a killed writer) always finds a complete file behind every name.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from elfes.files import TEMPORARY_PREFIX, atomic_writer, fsync_directory, replace_symlink

FORMAT = "elfes-checkpoint"
VERSION = 1
POINTERS = ("last", "best", "final")
Weights = Literal["raw", "ema"]

_NAME = re.compile(r"^step-(\d+)-batches-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, with the reason and what to do instead."""


@dataclass(frozen=True, order=True)
class CheckpointName:
    step: int
    batches: int

    @property
    def filename(self) -> str:
        return f"step-{self.step:08d}-batches-{self.batches:010d}.pt"

    @classmethod
    def parse(cls, filename: str) -> CheckpointName | None:
        match = _NAME.match(filename)
        return cls(int(match[1]), int(match[2])) if match else None


class CheckpointDirectory:
    """The one owner of a checkpoint folder's file names.

    Only the main process writes; every method that changes the folder publishes atomically.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def file(self, name: CheckpointName) -> Path:
        return self.path / name.filename

    def pointer(self, pointer: str) -> Path:
        if pointer not in POINTERS:
            raise ValueError(f"Unknown checkpoint pointer {pointer!r}; use one of {POINTERS}.")
        return self.path / pointer

    def checkpoints(self) -> list[Path]:
        """Published checkpoint files, oldest first."""
        if not self.path.is_dir():
            return []
        named = [(CheckpointName.parse(entry.name), entry) for entry in self.path.iterdir()]
        return [entry for name, entry in sorted((n, e) for n, e in named if n is not None)]

    def save(self, payload: Mapping[str, Any], name: CheckpointName) -> tuple[Path, int]:
        """Write ``payload`` as checkpoint ``name`` atomically; return its path and size in bytes."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temporaries()
        final = self.file(name)
        with atomic_writer(final) as stream:
            torch.save(dict(payload), stream)
        return final, final.stat().st_size

    def point(self, pointer: str, target: Path) -> None:
        """Make ``pointer`` a relative symlink to ``target``, replacing any old link atomically."""
        replace_symlink(self.pointer(pointer), os.path.relpath(target, self.path))

    def pointer_targets(self) -> set[Path]:
        targets = set()
        for pointer in POINTERS:
            link = self.pointer(pointer)
            if link.is_symlink():
                targets.add((self.path / os.readlink(link)).resolve())
        return targets

    def apply_retention(self, keep: int | None) -> list[Path]:
        """Delete all but the ``keep`` newest checkpoints, never a pointer's target. Returns the deleted."""
        if keep is None:
            return []
        protected = self.pointer_targets()
        files = self.checkpoints()
        deleted = []
        for path in files[: max(len(files) - keep, 0)]:
            if path.resolve() not in protected:
                path.unlink()
                deleted.append(path)
        if deleted:
            fsync_directory(self.path)
        return deleted

    def _remove_stale_temporaries(self) -> None:
        # A single process writes this folder, so any temporary left here belongs to a killed writer.
        for entry in self.path.glob(f"{TEMPORARY_PREFIX}*"):
            entry.unlink(missing_ok=True)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint file (or pointer) with ``weights_only=True``, or explain why it cannot be used."""
    path = Path(path)
    if not path.exists():
        hint = f" A pointer {path.name!r} is only created once a checkpoint is published." if path.name in POINTERS else ""
        raise FileNotFoundError(f"Checkpoint {path} does not exist.{hint} Pass an existing checkpoint file or pointer.")
    resolved = path.resolve()
    try:
        payload = torch.load(resolved, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{resolved} holds Python objects that safe loading (torch.load(weights_only=True)) refuses to "
            f"build ({error}). ELFES checkpoints contain only tensors and plain values, so this file was not "
            "written by ELFES, or was altered. Pass a checkpoint written by Trainer.train(checkpoint_dir=...)."
        ) from error
    except Exception as error:  # torch raises several types for truncated or damaged archives
        raise CheckpointError(_unreadable_message(resolved, error)) from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(
            f"{resolved} is not an ELFES checkpoint (no '{FORMAT}' marker). Pass a file written by "
            "Trainer.train(checkpoint_dir=...), or one of its 'last', 'best' or 'final' pointers."
        )
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{resolved} has checkpoint format version {payload.get('version')!r}; this ELFES reads version "
            f"{VERSION}. Continue that run with the ELFES version that wrote it."
        )
    return payload


def _unreadable_message(path: Path, error: Exception) -> str:
    name = CheckpointName.parse(path.name)
    held = f" It held step {name.step} (after {name.batches} batches)." if name else ""
    previous = _previous_readable(path, name) if name else None
    advice = (
        f" Resume from the previous checkpoint instead: {previous}"
        if previous
        else " No earlier complete checkpoint exists in that folder; start the run again."
    )
    return f"Checkpoint {path} is truncated or corrupted ({type(error).__name__}: {error}).{held}{advice}"


def _previous_readable(path: Path, name: CheckpointName) -> Path | None:
    for candidate in reversed(CheckpointDirectory(path.parent).checkpoints()):
        parsed = CheckpointName.parse(candidate.name)
        if parsed is not None and parsed < name and _is_complete_zip(candidate):
            return candidate
    return None


def _is_complete_zip(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (zipfile.BadZipFile, OSError):
        return False


def checkpoint_weights(payload: Mapping[str, Any], weights: Weights, source: Path) -> dict[str, torch.Tensor]:
    """The plain model state dict of a checkpoint: raw weights, or EMA parameters with raw buffers."""
    if weights not in ("raw", "ema"):
        raise ValueError(f"weights is {weights!r}; use 'raw' or 'ema'.")
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

    No optimizer or DataLoader is needed. ``checkpoint`` may be a file or a pointer such as
    ``run_dir / "checkpoints" / "best"``.

    >>> load_weights(model, run_dir / "checkpoints" / "best", weights="ema")
    >>> model = accelerator.prepare(model)
    """
    source = Path(checkpoint)
    state = checkpoint_weights(read_checkpoint(source), weights, source.resolve())
    _check_unwrapped(model)
    model.load_state_dict(state)


def export_weights(checkpoint: Path, path: Path, *, weights: Weights = "raw") -> None:
    """Write a checkpoint's raw or EMA weights as a plain model state dict to ``path`` (atomically).

    >>> export_weights(run_dir / "checkpoints" / "best", run_dir / "model.pt", weights="ema")
    >>> model.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))
    """
    source = Path(checkpoint)
    save_state_dict(checkpoint_weights(read_checkpoint(source), weights, source.resolve()), Path(path))


def save_state_dict(state: Mapping[str, torch.Tensor], path: Path) -> None:
    """Write a plain state dict atomically (temporary name, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as stream:
        torch.save(dict(state), stream)


def _check_unwrapped(model: nn.Module) -> None:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) or hasattr(model, "_orig_mod"):
        raise TypeError(
            "load_weights needs the plain model: pass it before accelerator.prepare() or torch.compile(), "
            "then prepare or compile it."
        )


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A model's state dict without DDP or torch.compile prefixes, cloned to the CPU."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}
