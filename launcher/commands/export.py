"""``elfes export``: a checkpoint's raw or EMA weights as a plain state dict file, or the whole checkpoint (optimizer
state included; a sharded one's shards read whole) as one file, on a login node.

Reading a checkpoint needs torch (a sharded one's shards are ``torch.distributed.checkpoint`` files), so this
verb imports it, and only this verb, when it runs; one process, no GPU and no process group, whatever world
size wrote the checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from elfes.contract import POINTERS, CheckpointName, Pointer

from ..rundir.lookup import UsageError
from ..rundir.paths import RunPaths

if TYPE_CHECKING:
    from elfes.engine.checkpoint import Weights  # a type only: this module imports torch when the verb runs


@dataclass(frozen=True)
class Exported:
    checkpoint: Path  # the checkpoint file or folder read (a pointer resolved)
    output: Path
    weights: str | None  # None: the whole checkpoint


def export(source: str | os.PathLike[str], output: str | os.PathLike[str], *, weights: Weights = "raw",
           whole: bool = False) -> Exported:
    """Write the ``weights`` of ``source`` (a checkpoint file or folder, a pointer, or a run directory: its
    ``last``), or with ``whole`` the whole checkpoint, to ``output`` atomically; UsageError for a path that is none
    of these or cannot be read (a damaged one: named, with the checkpoint to use instead)."""
    if whole and weights != "raw":
        raise UsageError(f"--whole writes every tensor of the checkpoint, raw and EMA weights alike; drop --weights {weights}")
    checkpoint = _checkpoint(Path(os.path.abspath(source)))
    from elfes.engine.checkpoint import CheckpointError  # torch, from here on
    from elfes.engine.weights import export_checkpoint, export_weights

    try:
        if whole:
            export_checkpoint(checkpoint, Path(output))
        else:
            export_weights(checkpoint, Path(output), weights=weights)
    except (CheckpointError, FileNotFoundError) as error:
        raise UsageError(f"{source}: {error}") from None
    return Exported(checkpoint.resolve(), Path(output), None if whole else weights)


def _checkpoint(path: Path) -> Path:
    if path.name in POINTERS or CheckpointName.parse(path.name) is not None:
        if not path.exists():
            raise UsageError(f"{path}: no such checkpoint; give a checkpoint, one of {', '.join(POINTERS)}, or a run directory")
        return path
    last = RunPaths(path).checkpoints / Pointer.LAST
    if path.is_dir() and last.exists():
        return last
    raise UsageError(
        f"{path}: neither a checkpoint (step-<step>-batches-<batches>.pt or .dcp, or a pointer such as last, best, "
        f"final) nor a run directory with {last.relative_to(path)}; give one of these"
    )
