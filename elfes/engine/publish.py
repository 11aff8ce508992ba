"""Publishing a checkpoint: inline at the boundary, or by a background writer from a snapshot.

A synchronous save writes the payload of live tensors before training resumes. An asynchronous
one copies every tensor of the payload into host buffers that are kept from one checkpoint to the
next (pinned when the tensors live on CUDA), then hands the copy to one writer thread and trains
on. Both publish the same way (:func:`publish`): the file first, the pointers only once it is
durable, retention last. The writer runs no collective; every rank's part was gathered before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from elfes.contract import Pointer

from .checkpointer import PendingWrite


def publish(pending: PendingWrite, *, best: bool, final: bool, keep: int | None, protect: tuple[Path, ...]) -> tuple[Path, int]:
    """Write ``pending``, then point ``last`` (and ``best``, ``final``) at it and apply retention,
    never deleting ``protect``. Returns the file and its size (0 on the ranks that write nothing)."""
    path, size = pending.write()
    if pending.main:
        directory = pending.directory
        directory.point(Pointer.LAST, path)
        if best:
            directory.point(Pointer.BEST, path)
        if final:
            directory.point(Pointer.FINAL, path)
        directory.apply_retention(keep, protect=protect)
    return path, size


class HostBuffers:
    """Host memory that snapshots copy into, kept from one checkpoint to the next.

    Reusing it spares every checkpoint after the first the allocation (and, for pinned memory, the
    page locking) of a payload-sized block. Only one snapshot may use it at a time: the session
    takes a new one only after the previous write has ended.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}  # by the tensor's place in the payload

    def snapshot(self) -> Snapshot:
        return Snapshot(self._buffers)


class Snapshot:
    """One checkpoint's copies: ``snapshot(tensor, where)`` returns a host copy that training cannot
    change; call :meth:`wait` before the copies are read (device-to-host copies run asynchronously)."""

    def __init__(self, buffers: dict[str, torch.Tensor]) -> None:
        self._buffers = buffers
        self._copies: dict[tuple[Any, ...], torch.Tensor] = {}  # one copy per view: tied weights stay tied
        self._devices: set[torch.device] = set()

    def __call__(self, tensor: torch.Tensor, where: str) -> torch.Tensor:
        tensor = tensor.detach()
        if tensor.layout != torch.strided or tensor.is_quantized:
            return tensor.to("cpu", copy=True)  # rare layouts: a plain copy, not worth a kept buffer
        view = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape, tensor.stride(), tensor.dtype)
        if view in self._copies:
            return self._copies[view]
        pinned = tensor.is_cuda
        buffer = self._buffers.get(where)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype or buffer.is_pinned() != pinned:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
            self._buffers[where] = buffer
        buffer.copy_(tensor, non_blocking=pinned)
        if pinned:
            self._devices.add(tensor.device)
        self._copies[view] = buffer
        return buffer

    def wait(self) -> None:
        """Return once every device-to-host copy has landed in host memory."""
        for device in self._devices:
            torch.cuda.current_stream(device).synchronize()


class BackgroundWriter:
    """Runs one publication at a time in a thread of its own; the loop collects its outcome.

    The thread is not a daemon: the interpreter waits for a write in flight before it exits.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._record: dict[str, Any] = {}
        self._outcome: tuple[Path, int, float] | BaseException | None = None

    @property
    def busy(self) -> bool:
        """Whether a write was started and its outcome not yet collected."""
        return self._thread is not None

    def finished(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def start(self, publication: Callable[[], tuple[Path, int]], record: dict[str, Any]) -> None:
        """Run ``publication`` in the background; ``record`` comes back with its outcome."""
        if self._thread is not None:
            raise RuntimeError("A checkpoint write is already in flight; collect it before starting another.")

        def run() -> None:
            started = time.perf_counter()
            try:
                path, size = publication()
            except BaseException as error:  # handed to the loop, which raises it
                self._outcome = error
            else:
                self._outcome = (path, size, time.perf_counter() - started)

        self._record, self._outcome = record, None
        self._thread = threading.Thread(target=run, name="elfes-checkpoint-writer")
        self._thread.start()

    def collect(self) -> tuple[dict[str, Any], Path, int, float]:
        """Wait for the write in flight; return its record, file, size and duration, or raise its failure."""
        assert self._thread is not None, "no checkpoint write in flight"
        self._thread.join()
        self._thread, outcome = None, self._outcome
        if isinstance(outcome, BaseException):
            add_note = getattr(outcome, "add_note", None)  # Python >= 3.11
            if add_note is not None:
                add_note(
                    f"This was the background write of {self._record['path']} (step {self._record['step']}); "
                    "`last` still names the previous complete checkpoint."
                )
            raise outcome
        assert outcome is not None  # the thread ended with its result or its failure
        path, size, duration = outcome
        return self._record, path, size, duration
