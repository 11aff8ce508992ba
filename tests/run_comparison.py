"""Comparing a finished run with its uninterrupted reference, tensor by tensor, with ``torch.equal``.

Shared by the local, single-host SLURM and two-host SLURM job tests (``tests/`` is on ``sys.path``
through its conftest). torch is imported inside, so login-node tests may import this module freely.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

# What a finished job leaves that must match the uninterrupted run: the final checkpoint (raw and
# EMA weights, optimizer state, schedule, generators) and the exported model.
COMPARED_FILES = ("checkpoints/final", "model.pt")


def named_tensors(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every tensor inside nested dicts, lists and tuples, named by its path (``/model/0.weight``)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from named_tensors(item, f"{prefix}/{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from named_tensors(item, f"{prefix}[{index}]")


def load_whole(path: Path) -> dict[str, Any]:
    """A checkpoint or exported model, read whole in this process: a sharded checkpoint's folder of DCP shards too."""
    import torch

    if path.is_dir():
        from elfes.engine.sharded import whole_sharded_checkpoint

        return whole_sharded_checkpoint(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_runs_bitwise_equal(run_dir: Path, reference: Path) -> None:
    """Every tensor of ``run_dir``'s final checkpoint and exported model is torch.equal to the reference's."""
    import torch

    for relative in COMPARED_FILES:
        ours, theirs = (dict(named_tensors(load_whole(folder / relative))) for folder in (run_dir, reference))
        assert ours, f"{run_dir / relative} holds no tensors"
        assert ours.keys() == theirs.keys(), f"{relative}: different tensors: {sorted(ours.keys() ^ theirs.keys())}"
        different = [name for name in ours if not torch.equal(ours[name], theirs[name])]
        assert not different, f"{relative}: tensors differ from the uninterrupted run: {different}"
