"""The collectives the engine runs besides a window's gradient all-reduce: each one a no-op in a single
process, and in several a call that every rank makes at the same point.

A gloo worker thread drops its references to a collective's tensors a moment after ``wait()`` has
returned. A tensor referenced from C++ as well as from Python has its Python object held by C++, and
whichever reference brings the count back to one releases that object, which takes the GIL. Were it the
worker's, after the last collective of a script that exits right away (an evaluation without a
``Trainer``) it could fall into interpreter shutdown, where CPython ends a thread that asks for the GIL
with ``pthread_exit``; its unwinding through the worker's C++ destructor aborts the rank ("terminate
called without an active exception", SIGABRT). So every tensor the engine hands to a collective is an
internal buffer that first gets a view (which references its base) kept here: the worker's release is
never the one back to one, and the view is dropped from the main thread once the backend has let go of
the buffer, at a later collective or at exit before shutdown begins.
"""

from __future__ import annotations

import atexit
import pickle
import time
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from accelerate import Accelerator

T = TypeVar("T")

# (buffer, a view of it) for each buffer lent to a collective; the buffer's reference count is 2 (its
# Python object and the view) once the backend has let go of it.
_lent: list[tuple[torch.Tensor, torch.Tensor]] = []


def _lend(*buffers: torch.Tensor) -> None:
    """Keep ``buffers`` referenced from C++ until the backend has let go of them; call before the collective."""
    _take_back_released()
    _lent.extend((buffer, buffer.view(buffer.shape)) for buffer in buffers)


def _take_back_released() -> None:
    _lent[:] = [(buffer, view) for buffer, view in _lent if buffer._use_count() > 2]  # type: ignore[attr-defined]  # private: not in torch's stubs


def take_back_lent_buffers(timeout_s: float = 30.0) -> int:
    """Wait (up to ``timeout_s``) until the backend has let go of every buffer lent to it and free them
    here; returns how many it still held. Runs at interpreter exit, before shutdown begins."""
    deadline = time.monotonic() + timeout_s
    while True:
        _take_back_released()
        if not _lent or time.monotonic() >= deadline:
            return len(_lent)
        time.sleep(0.001)  # polling interval; the workers need no GIL to let go


atexit.register(take_back_lent_buffers)


def sum_over_ranks(values: torch.Tensor, accelerator: Accelerator) -> torch.Tensor:
    """``values`` summed over every rank (into a copy: ``values`` is kept)."""
    return reduce_over_ranks(values, accelerator, dist.ReduceOp.SUM)


def reduce_over_ranks(values: torch.Tensor, accelerator: Accelerator, op: Any) -> torch.Tensor:
    """``values`` reduced with ``op`` (a ``dist.ReduceOp``) over every rank, into a copy."""
    if accelerator.num_processes == 1:
        return values
    buffer = values.clone()
    _lend(buffer)
    dist.all_reduce(buffer, op=op)
    return buffer.clone()  # a view the caller kept of the buffer would hold it here until exit


def main_process_value(value: T, accelerator: Accelerator) -> T:
    """The main process's ``value`` (any picklable object), on every rank."""
    if accelerator.num_processes == 1:
        return value
    main = accelerator.is_main_process
    payload = _pickled(value, accelerator.device) if main else None
    size = torch.tensor([0 if payload is None else payload.numel()], dtype=torch.int64, device=accelerator.device)
    _lend(size)
    dist.broadcast(size, src=0)
    received = payload if payload is not None else torch.empty(int(size.item()), dtype=torch.uint8, device=accelerator.device)
    _lend(received)
    dist.broadcast(received, src=0)
    return value if main else cast(T, _unpickled(received))  # what the main process pickled: a T


def every_rank_value(value: Any, accelerator: Accelerator) -> list[Any]:
    """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
    if accelerator.num_processes == 1:
        return [value]
    device, world = accelerator.device, accelerator.num_processes
    payload = _pickled(value, device)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(world)]
    _lend(size, *sizes)
    dist.all_gather(sizes, size)
    lengths = [int(rank_size.item()) for rank_size in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    gathered = [torch.empty(max(lengths), dtype=torch.uint8, device=device) for _ in range(world)]
    _lend(padded, *gathered)
    dist.all_gather(gathered, padded)
    return [_unpickled(rank_payload[:length]) for rank_payload, length in zip(gathered, lengths)]


def _pickled(value: Any, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8).to(device, copy=True)


def _unpickled(payload: torch.Tensor) -> Any:
    return pickle.loads(payload.cpu().numpy().tobytes())
