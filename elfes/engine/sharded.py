"""Sharded checkpoints of an FSDP2 model: one folder per checkpoint, every rank writing its own shards.

A folder ``step-<step>-batches-<batches>.dcp`` holds the model's raw and EMA weights and the optimizer
state as ``torch.distributed.checkpoint`` (DCP) shards (a ``__<rank>_0.distcp`` file per rank and DCP's
``.metadata``), and ``state.pt``: everything else a checkpoint holds (format, version, run id, layout,
scheduler, scaler, ``TrainState``, progress, the optimizer's hyperparameters, every rank's RNG and data
state), loadable with ``torch.load(weights_only=True)``. Every rank writes into the folder under a
temporary name; once DCP's save has returned on the main process (DCP's coordinator writes ``.metadata``
after every rank's shards are written and fsynced), it writes ``state.pt`` last, fsyncs the folder and
renames it into place: a folder under a checkpoint's name is complete.

The writes run on a process group of their own, so that a background write's collectives never
interleave with training's. Only tensors go through DCP: its loader unpickles any other entry with
``weights_only=False``, and its ``.metadata`` with plain pickle; every read goes through :class:`SafeReader`,
which builds DCP's metadata classes and nothing else, accepts tensor entries in the folder's own shard files
only, and checks each entry's checksums.

Importing this module imports DCP and DTensor (about a second of a process's time): only a run whose model is
sharded (:func:`~elfes.engine.fsdp.is_sharded`) or that reads a sharded checkpoint imports it.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.tensor import DTensor

from elfes.contract import CheckpointName
from elfes.files import TEMPORARY_PREFIX, atomic_writer, fsync_directory

from .checkpoint import (
    SHARDED_STATE_FILE,
    CheckpointDirectory,
    CheckpointError,
    Weights,
    read_checkpoint,
    unreadable_message,
)
from .checkpointer import CheckpointContents
from .collectives import main_process_value
from .dcp_reader import SafeReader
from .fsdp import reshard
from .payload import ShardDamage, TensorCopy, UnusableCheckpointError, model_mismatches, plain_payload

SHARDED_PARTS = ("model", "ema", "optimizer")  # the components whose tensors DCP writes, each rank its shards


def saved_tensors(metadata: Metadata, part: str, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    """Empty tensors of the shapes and dtypes a folder holds for ``part`` ("model", "ema"), by parameter name."""
    prefix = f"{part}."
    return {
        key[len(prefix):]: torch.empty(tuple(entry.size), dtype=entry.properties.dtype, device=device)
        for key, entry in metadata.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(entry, TensorStorageMetadata)
    }


def sharded_weights(folder: Path, weights: Weights, payload: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """The full raw (or EMA, with raw buffers) weights of sharded checkpoint ``folder`` (``payload``: its
    ``state.pt``, where the caller has read it), read in this process alone: no process group is needed, the job's
    world size does not matter."""
    shards = SafeReader(folder)
    if payload is None:
        payload = read_checkpoint(folder, shards)
    metadata = shards.read_metadata()
    state = {"model": saved_tensors(metadata, "model", "cpu")}
    if weights == "ema":
        state["ema"] = saved_tensors(metadata, "ema", "cpu")
        if not state["ema"]:
            raise CheckpointError(
                f"{folder} was written without EMA, so it has no 'ema' weights; ask for weights='raw', "
                "or train with ema_decay to have averaged weights."
            )
        missing = sorted(set(payload.get("ema_names", ())) - set(state["ema"]))
        if missing:  # the raw tensor must not stand in for an average silently
            raise UnusableCheckpointError(
                f"{folder} lacks the EMA tensor of {', '.join(missing)} (no 'ema.{missing[0]}' entry in its .metadata), "
                "which the run averaged: the folder is damaged or was altered. Export the raw weights (weights='raw'), "
                "or the EMA weights of another checkpoint of the run."
            )
    load_shards(state, shards, no_dist=True)
    return {**state["model"], **state.get("ema", {})}


def whole_sharded_checkpoint(folder: Path) -> dict[str, Any]:
    """Sharded checkpoint ``folder`` as one payload, read in this process alone: ``state.pt``'s entries, with the
    whole tensors of the shards under ``model`` and ``ema`` (by parameter name) and ``optimizer`` (by parameter
    index, then state name), for comparing two checkpoints tensor by tensor whatever world size wrote them."""
    shards = SafeReader(folder)
    payload = read_checkpoint(folder, shards)
    metadata = shards.read_metadata()
    tensors = {key: torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
               for key, entry in metadata.state_dict_metadata.items() if isinstance(entry, TensorStorageMetadata)}
    load_shards(tensors, shards, no_dist=True)
    for key, tensor in sorted(tensors.items()):
        part, _, name = key.partition(".")
        if part == "optimizer":
            index, _, name = name.partition(".")
            payload.setdefault(part, {}).setdefault(index, {})[name] = tensor
        else:
            payload.setdefault(part, {})[name] = tensor
    return payload


def load_shards(state: dict[str, Any], shards: SafeReader, **options: Any) -> None:
    """``dcp.load`` of ``state`` from a sharded checkpoint through ``shards``, the folder's :class:`SafeReader`
    (``options``: DCP's, e.g. ``process_group`` or ``no_dist``). A refusal of the reader is raised as it is, before
    DCP sees it; a damaged shard (one DCP cannot read: it raises its CheckpointException, a BaseException) is a
    CheckpointError naming the step and the checkpoint to use instead."""
    folder = Path(shards.path)
    try:
        shards.read_metadata()  # checked once per reader: DCP's own read below is given what this one found
    except ShardDamage as damage:
        raise UnusableCheckpointError(unreadable_message(folder.resolve(), damage)) from None
    try:
        with warnings.catch_warnings():  # DCP warns when it loads in one process, which no_dist asks for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            state_dict_loader.load(state, storage_reader=shards, **options)
    except CheckpointException as error:
        causes = [failure[0] if isinstance(failure, tuple) else failure for _, failure in sorted(error.failures.items())]
        refused = next((cause for cause in causes if isinstance(cause, CheckpointError) and not isinstance(cause, ShardDamage)), None)
        if refused is not None:
            raise refused from None
        cause = causes[0] if causes else RuntimeError("DCP could not read it")
        raise UnusableCheckpointError(unreadable_message(folder.resolve(), cause)) from None


@dataclass(frozen=True)
class PendingShards:
    """A sharded checkpoint ready to be written: every rank's ``tensors`` (None where the folder already holds
    this position) and the main process's ``payload`` for ``state.pt``."""

    directory: CheckpointDirectory
    name: CheckpointName
    tensors: dict[str, Any] | None
    payload: dict[str, Any] | None
    main: bool
    group: Any  # the process group of checkpoint writes
    every_rank_writes = True

    @property
    def path(self) -> Path:
        return self.directory.file(self.name)

    def write(self) -> tuple[Path, int]:
        """Write every rank's shards, then (main process) ``state.pt`` and the rename into place. Every rank calls
        it; returns the folder and, on the main process, its size in bytes (0 on the other ranks)."""
        final = self.path
        if self.tensors is not None:
            temporary = self.directory.path / f"{TEMPORARY_PREFIX}{self.name.filename}"
            state_dict_saver.save(self.tensors, storage_writer=FileSystemWriter(temporary), process_group=self.group)
            if self.main:
                with atomic_writer(temporary / SHARDED_STATE_FILE) as stream:
                    torch.save(self.payload, stream)
                fsync_directory(temporary)
                _rename_into_place(temporary, final)
        return final, sum(entry.stat().st_size for entry in final.iterdir()) if self.main else 0


def _rename_into_place(folder: Path, final: Path) -> None:
    """Rename ``folder`` to ``final``. A folder already there (this position written before, with another state)
    moves aside first: a kill between the two renames leaves no folder of that name, never a mixed one."""
    old = None
    if final.exists():
        old = final.rename(final.with_name(f"{TEMPORARY_PREFIX}{final.name}.replaced"))
    os.replace(folder, final)
    fsync_directory(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class ShardedCheckpointer:
    """The :class:`~elfes.engine.checkpointer.Checkpointer` of an FSDP2 model: the model, EMA and optimizer
    tensors in DCP shards written by every rank, every other component's state in ``state.pt``.

    ``group`` is the process group the writes run on (one of their own: a background write's collectives
    must not interleave with training's).
    """

    sharded = True

    def __init__(self, contents: CheckpointContents, group: Any) -> None:
        self.contents = contents
        self.group = group

    def layout(self) -> dict[str, Any]:
        return self.contents.layout()

    def components(self) -> dict[str, Any]:
        return self.contents.parts()

    def snapshot(
        self, directory: CheckpointDirectory, name: CheckpointName, *, reuse: bool, run_id: str | None, copy: TensorCopy | None = None
    ) -> PendingShards:
        contents = self.contents
        main = contents.accelerator.is_main_process
        if main:  # before the gather below: no rank writes into the folder before a stale one of its name is gone
            directory.path.mkdir(parents=True, exist_ok=True)
            directory.remove_stale_temporaries()
        ranks = contents.rank_states(on_cpu=True)
        if main_process_value(reuse and directory.file(name).exists(), contents.accelerator):
            return PendingShards(directory, name, None, None, main, self.group)
        model, ema, optimizer = (contents.part(part) for part in SHARDED_PARTS)
        optimizer_state = optimizer.state_dict()
        tensors: dict[str, Any] = {
            "model": {key: tensor.detach() for key, tensor in model.state_dict().items()},
            "optimizer": {str(index): {key: value for key, value in state.items() if isinstance(value, torch.Tensor)}
                          for index, state in optimizer_state["state"].items()},
        }
        if ema is not None:
            tensors["ema"] = ema.state_dict()
        if copy is not None:
            tensors = _copied(tensors, copy, "shards")
        payload = None
        if main:
            payload = {**contents.header(run_id), **contents.shared_states(on_cpu=False, leave_out=SHARDED_PARTS)}
            if ema is not None:  # what an export of the EMA weights must find in the shards
                payload["ema_names"] = sorted(tensors["ema"])
            payload["optimizer_groups"] = [{k: v for k, v in group.items() if k != "params"} for group in optimizer_state["param_groups"]]
            payload["optimizer_values"] = {  # per-parameter state that is no tensor (DCP would pickle it)
                str(index): {key: value for key, value in state.items() if not isinstance(value, torch.Tensor)}
                for index, state in optimizer_state["state"].items()
            }
            payload["ranks"] = ranks
            payload = plain_payload(payload, copy=copy)
        return PendingShards(directory, name, tensors, payload, main, self.group)

    def restore(self, source: Path) -> dict[str, Any]:
        resolved = Path(source).resolve()
        shards = SafeReader(resolved)
        payload = read_checkpoint(source, shards)
        if not resolved.is_dir():
            raise CheckpointError(
                f"{resolved} is a single-file checkpoint of a model that was not sharded, and this run's model is "
                "sharded with fully_shard. Resume it with the model as it was, or start a new run from its weights "
                "(load_weights into the plain model, then shard it)."
            )
        metadata = shards.read_metadata()  # as read_checkpoint checked it: every shard file there in full
        model, ema, optimizer = (self.contents.part(part) for part in SHARDED_PARTS)
        self.contents.check_fits(payload, resolved, model_mismatches(saved_tensors(metadata, "model"), model.state_dict()))
        state = {"model": model.state_dict(), "optimizer": _optimizer_tensors(optimizer, metadata)}
        if ema is not None:
            state["ema"] = ema.state_dict()
        load_shards(state, shards, process_group=self.group)
        model.load_state_dict(state["model"])
        reshard(model)  # no whole parameters gathered before the restore are used after it
        parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
        for index, values in payload["optimizer_values"].items():
            optimizer.state[parameters[int(index)]].update(values)
        for group, saved in zip(optimizer.param_groups, payload["optimizer_groups"]):
            group.update(saved)
        self.contents.restore(payload, leave_out=SHARDED_PARTS)
        return payload


def _optimizer_tensors(optimizer: torch.optim.Optimizer, metadata: Metadata) -> dict[str, dict[str, torch.Tensor]]:
    """The optimizer's live state tensors for DCP to load into, by parameter index, for the parameters the
    checkpoint holds state of (an optimizer that has not stepped yet is given its state by a step that
    changes nothing: zero gradients, learning rate 0; DCP then overwrites every tensor of it)."""
    held = {key.split(".")[1] for key in metadata.state_dict_metadata if key.startswith("optimizer.")}
    parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    if held and not optimizer.state:
        _initialise_state(optimizer, parameters)
    for index, parameter in enumerate(parameters):
        if str(index) not in held:  # no state in the checkpoint: none in the straight run either
            optimizer.state.pop(parameter, None)
    return {str(index): {key: value for key, value in optimizer.state[parameter].items() if isinstance(value, torch.Tensor)}
            for index, parameter in enumerate(parameters) if str(index) in held}


@torch.no_grad()
def _initialise_state(optimizer: torch.optim.Optimizer, parameters: list[torch.Tensor]) -> None:
    learning_rates = [group["lr"] for group in optimizer.param_groups]
    for parameter in parameters:
        parameter.grad = torch.zeros_like(parameter)
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, learning_rate in zip(optimizer.param_groups, learning_rates):
        group["lr"] = learning_rate
    optimizer.zero_grad(set_to_none=True)


def _copied(value: Any, copy: TensorCopy, where: str) -> Any:
    """``value`` with every tensor replaced by ``copy(tensor, where)``: a DTensor by a DTensor of the same
    placements over a copy of its local shard."""
    if isinstance(value, DTensor):
        local = copy(value.to_local(), where)
        return DTensor.from_local(local, value.device_mesh, value.placements, run_check=False, shape=value.shape, stride=value.stride())
    if isinstance(value, torch.Tensor):
        return copy(value, where)
    if isinstance(value, Mapping):
        return {key: _copied(item, copy, f"{where}[{key!r}]") for key, item in value.items()}
    return value
