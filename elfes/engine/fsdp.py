"""A model sharded with FSDP2, asked about without importing FSDP2 where no model can be sharded: a model is an
``FSDPModule`` only once ``torch.distributed.fsdp`` is imported (``fully_shard`` lives there), and that import
(DTensor, sympy) costs a process about a second. A run of a plain model never pays it, and only a run whose
model is sharded imports :mod:`.sharded`, its checkpoints in DCP shards."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

FSDP_MODULE = "torch.distributed.fsdp"
DTENSOR_MODULE = "torch.distributed.tensor"


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` (or the module a compiled model wraps) was sharded with FSDP2's ``fully_shard``."""
    if FSDP_MODULE not in sys.modules:  # nothing has been sharded in this process
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)


def reshard(model: nn.Module) -> None:
    """Free the whole parameters a sharded model's forward gathered and kept (FSDP2 keeps the root's after a forward
    without backward): the next forward gathers them again from the shards, which an EMA swap or a restore may
    have changed meanwhile. Nothing for a model that is not sharded."""
    if FSDP_MODULE not in sys.modules:
        return
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def mesh_shape(model: nn.Module) -> list[int] | None:
    """The device mesh a sharded model's parameters are spread over, e.g. [2] or [2, 2] (HSDP); None if none is."""
    if DTENSOR_MODULE not in sys.modules:  # no parameter is a DTensor
        return None
    from torch.distributed.tensor import DTensor

    mesh = next((p.device_mesh for p in model.parameters() if isinstance(p, DTensor)), None)
    return None if mesh is None else list(mesh.shape)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local part (a sharded model's gradient norm is a replicated DTensor), any other tensor itself."""
    from torch.distributed.tensor import DTensor  # imported with FSDP2, which sharded the model

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_state_dict(model: nn.Module, average: Mapping[str, torch.Tensor] | None, main: bool) -> dict[str, torch.Tensor]:
    """A sharded model's full state dict on the CPU of the main process (empty elsewhere), with the averaged
    parameters ``average`` in place of the raw ones when given. Every rank calls it (it gathers the shards)."""
    from torch.distributed.tensor import DTensor  # imported with FSDP2, which sharded the model

    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    state.update(average or {})
    full = {}
    for name, tensor in state.items():
        whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if main:
            full[name] = whole.to("cpu", copy=True)
    return full


def checkpoint_group() -> Any:
    """A process group for a sharded model's checkpoint writes alone (every rank calls this, in the same order)."""
    return dist.new_group(backend="gloo")
