"""The collectives the engine runs besides a window's gradient all-reduce: each one a no-op in a single
process, and in several a call that every rank makes at the same point."""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist
from accelerate import Accelerator

T = TypeVar("T")


def sum_over_ranks(values: torch.Tensor, accelerator: Accelerator) -> torch.Tensor:
    """``values`` summed over every rank (into a copy: ``values`` is kept)."""
    if accelerator.num_processes > 1:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def main_process_value(value: T, accelerator: Accelerator) -> T:
    """The main process's ``value`` (any picklable object), on every rank."""
    if accelerator.num_processes == 1:
        return value
    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def every_rank_value(value: Any, accelerator: Accelerator) -> list[Any]:
    """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
    if accelerator.num_processes == 1:
        return [value]
    gathered: list[Any] = [None] * accelerator.num_processes
    dist.all_gather_object(gathered, value)
    return gathered
