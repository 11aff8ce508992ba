"""The checkpoint format and its directory: atomic files, pointer symlinks, retention, loading.

One checkpoint is one complete PyTorch file, ``step-<step>-batches-<batches>.pt``, written under a
temporary name in the same folder, fsynced, renamed into place, and the folder fsynced (a sharded
model's is a folder, ``.dcp``, published the same way: :mod:`.sharded`). ``last``, ``best`` and
``final`` are relative symlinks, each replaced by renaming a new link over the old one, so a reader
(or a killed writer) always finds a complete checkpoint behind every name.
"""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from accelerate import Accelerator
from torch import nn

from elfes.contract import POINTERS, CheckpointName, Pointer
from elfes.files import TEMPORARY_PREFIX, atomic_writer, fsync_directory, replace_symlink
from elfes.world_size import PER_WORLD_LAYOUT, resize_problems

from .collectives import every_rank_value
from .dcp_reader import SafeReader, ShardDamage
from .payload import CheckpointError as CheckpointError  # re-exported: its home for callers
from .payload import TensorCopy, UnusableCheckpointError, model_mismatches, plain_payload
from .resize import restore_resized

FORMAT = "elfes-checkpoint"
VERSION = 3  # 3: a batch read in the training process draws torch's numbers under its place's seed (2 did not)
SHARDED_STATE_FILE = "state.pt"  # in a sharded checkpoint's folder: all but the sharded tensors
Weights = Literal["raw", "ema"]


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
        self.remove_stale_temporaries()
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

    def newest_complete(self, run_id: str | None = None) -> Path | None:
        """The newest checkpoint file whose archive is complete (a kill may leave none behind a pointer),
        of run ``run_id`` when given."""
        return next((path for path in reversed(self.checkpoints())
                     if _is_complete(path) and (run_id is None or checkpoint_run_id(path) == run_id)), None)

    def run_ids(self) -> set[str | None]:
        """The run ids of the folder's complete checkpoints (None for a file that records none)."""
        return {checkpoint_run_id(path) for path in self.checkpoints() if _is_complete(path)}

    def apply_retention(self, keep: int | None, protect: tuple[Path, ...] = ()) -> list[Path]:
        """Delete all but the ``keep`` newest checkpoints, never a pointer's target nor ``protect``.

        Returns the deleted files.
        """
        if keep is None:
            return []
        protected = self.pointer_targets() | {path.resolve() for path in protect}
        files = self.checkpoints()
        deleted = []
        for path in files[: max(len(files) - keep, 0)]:
            if path.resolve() not in protected:
                remove_entry(path)
                deleted.append(path)
        if deleted:
            fsync_directory(self.path)
        return deleted

    def remove_stale_temporaries(self) -> None:
        # A single process writes this folder, so any temporary left here belongs to a killed writer.
        for entry in self.path.glob(f"{TEMPORARY_PREFIX}*"):
            remove_entry(entry)


def remove_entry(path: Path) -> None:
    """Delete a checkpoint file, or a folder after renaming it to a temporary name: a kill half-way through
    leaves no half-deleted folder under a checkpoint's name."""
    if not path.is_dir() or path.is_symlink():
        path.unlink(missing_ok=True)
        return
    if not path.name.startswith(TEMPORARY_PREFIX):
        path = path.rename(path.with_name(f"{TEMPORARY_PREFIX}{path.name}.deleted"))
    shutil.rmtree(path, ignore_errors=True)


def payload_file(path: Path) -> Path:
    """The file holding a checkpoint's marker, run id and layout: the checkpoint itself, or a sharded
    checkpoint folder's state file."""
    return path / SHARDED_STATE_FILE if path.is_dir() else path


def read_checkpoint(path: Path, shards: SafeReader | None = None) -> dict[str, Any]:
    """Load a checkpoint file (or pointer) with ``weights_only=True``, or explain why it cannot be used. A sharded
    one's metadata is checked by ``shards`` (its folder's reader, to hand on to its load), else by a new reader."""
    path = Path(path)
    if not path.exists():
        hint = f" A pointer {path.name!r} is only created once a checkpoint is published." if path.name in POINTERS else ""
        raise FileNotFoundError(f"Checkpoint {path} does not exist.{hint} Pass an existing checkpoint file or pointer.")
    resolved = path.resolve()
    try:
        payload = torch.load(payload_file(resolved), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{resolved} holds Python objects that safe loading (torch.load(weights_only=True)) refuses to "
            f"build ({error}). ELFES checkpoints contain only tensors and plain values, so this file was not "
            "written by ELFES, or was altered. Pass a checkpoint written by Trainer.train(checkpoint_dir=...)."
        ) from None  # the message carries the cause; the chained traceback would bury it
    except Exception as error:  # torch raises several types for truncated or damaged archives
        raise UnusableCheckpointError(unreadable_message(resolved, error)) from None
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
    if resolved.is_dir():  # a sharded checkpoint: its metadata read safely, every shard file there in full
        try:
            (shards if shards is not None else SafeReader(resolved)).read_metadata()
        except ShardDamage as damage:
            raise UnusableCheckpointError(unreadable_message(resolved, damage)) from None
    return payload


def unreadable_message(path: Path, error: BaseException) -> str:
    """What a damaged checkpoint ``path`` holds (its step), why it cannot be read, and the checkpoint to use instead."""
    name = CheckpointName.parse(path.name)
    held = f" It held step {name.step} (after {name.batches} batches)." if name else ""
    previous = _previous_readable(path, name) if name else None
    advice = (
        f" Resume from the previous checkpoint instead: {previous}"
        if previous
        else " No earlier complete checkpoint exists in that folder; start the run again."
    )
    reason = str(error) if isinstance(error, ShardDamage) else f"{type(error).__name__}: {error}"
    return f"Checkpoint {path} is truncated or corrupted ({reason}).{held}{advice}"


def _previous_readable(path: Path, name: CheckpointName) -> Path | None:
    for candidate in reversed(CheckpointDirectory(path.parent).checkpoints()):
        parsed = CheckpointName.parse(candidate.name)
        if parsed is not None and parsed < name and _is_complete(candidate):
            return candidate
    return None


def _is_complete(path: Path) -> bool:
    """Whether a checkpoint's file (a sharded folder's state file, written last) is a complete archive, and a
    sharded folder's shard files are all there in full."""
    try:
        with zipfile.ZipFile(payload_file(path)) as archive:
            intact = archive.testzip() is None
        if intact and path.is_dir():
            SafeReader(path).read_metadata()
        return intact
    except (zipfile.BadZipFile, OSError, EOFError, CheckpointError):
        return False


# ------------------------------------------------------------------------------------------------
# The checkpointer: what a checkpoint holds, whether it fits a run, and how it is restored.

# Layout entries that change rounding but not meaning: a mismatch warns instead of refusing.
_ADVISORY_LAYOUT = ("torch_threads",)


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint whose payload is built, ready to be written (``payload`` is None where nothing is
    written: on the other ranks, and when the file already holds this position)."""

    directory: CheckpointDirectory
    name: CheckpointName
    payload: dict[str, Any] | None
    main: bool
    every_rank_writes = False  # a sharded checkpoint's write is collective (:mod:`.sharded`)

    @property
    def path(self) -> Path:
        return self.directory.file(self.name)

    def write(self) -> tuple[Path, int]:
        """Publish the file atomically (main process only); returns its path and size (0 on the other ranks)."""
        if not self.main:
            return self.path, 0
        if self.payload is None:
            return self.path, self.path.stat().st_size
        return self.directory.save(self.payload, self.name)


class Checkpointer:
    """Saves and restores everything that must survive a restart, named in one place.

    ``shared`` components (model, EMA, optimizer, scheduler, scaler, state, progress) are saved once
    by the main process; ``per_rank`` components (each rank's RNG and log interval) are gathered
    from every rank. Each component has ``state_dict``/``load_state_dict``; ``layout`` describes
    what a resuming run must share with the checkpoint. Every rank calls :meth:`snapshot` (then
    ``write()`` it) and :meth:`restore`.
    """

    sharded = False  # one file, written by the main process (a sharded model's: :mod:`.sharded`)

    def __init__(self, accelerator: Accelerator, shared: Mapping[str, Any], per_rank: Mapping[str, Any],
                 layout: Callable[[], dict[str, Any]]) -> None:
        self.accelerator = accelerator
        self.shared = dict(shared)
        self.per_rank = dict(per_rank)
        self.layout = layout

    def components(self) -> dict[str, Any]:
        """Every checkpointed object by name (None where a part is absent, e.g. no EMA)."""
        return {**self.shared, **self.per_rank}

    def snapshot(
        self, directory: CheckpointDirectory, name: CheckpointName, *, reuse: bool, run_id: str | None, copy: TensorCopy | None = None
    ) -> PendingCheckpoint:
        """The collective part of saving checkpoint ``name`` (kept as it is when ``reuse``): every rank's
        states gathered, the main process's payload built. Without ``copy`` the payload holds live tensors
        and is written before training resumes; with it, each tensor is ``copy(tensor, where)``."""
        ranks = self._gather([_component_state(component, copy is None) for component in self.per_rank.values()])
        main = self.accelerator.is_main_process
        if not main or (reuse and directory.file(name).exists()):
            return PendingCheckpoint(directory, name, None, main)
        payload: dict[str, Any] = {"format": FORMAT, "version": VERSION, "run_id": run_id, "layout": self.layout()}
        for key, component in self.shared.items():
            payload[key] = _component_state(component, copy is None)
        payload["ranks"] = [dict(zip(self.per_rank, states)) for states in ranks]
        return PendingCheckpoint(directory, name, plain_payload(payload, copy=copy), main)

    def restore(self, source: Path) -> dict[str, Any]:
        """Check that checkpoint ``source`` fits this run, then load every component from it."""
        payload = read_checkpoint(source)
        resolved = Path(source).resolve()
        saved_model = payload.get("model")  # None in a sharded checkpoint: its layout tells this run it does not fit
        self.check_fits(payload, resolved, [] if saved_model is None else model_mismatches(saved_model, self.shared["model"].state_dict()))
        for key, component in self.shared.items():
            if component is not None:
                component.load_state_dict(payload[key])
        self.restore_per_rank(payload)
        return payload

    def check_fits(self, payload: Mapping[str, Any], resolved: Path, mismatches: list[str]) -> None:
        """Refuse checkpoint ``resolved`` whose layout, model randomness or model (``mismatches``) does not fit this run."""
        expected, found = self.layout(), payload["layout"]
        resized = len(payload["ranks"]) != self.accelerator.num_processes
        unchecked = _ADVISORY_LAYOUT + (PER_WORLD_LAYOUT if resized else ())  # a resize checks them as one window
        mismatches = [f"{key}: the checkpoint has {found.get(key)!r}, this run has {expected[key]!r}"
                      for key in expected if key not in unchecked and found.get(key) != expected[key]] + mismatches
        recorded, randomness = payload["progress"].get("model_randomness"), self.shared["progress"].model_randomness
        if recorded is not None and recorded != randomness:  # None: a checkpoint older than the record, taken as it is
            mismatches.append(f"model_randomness: the checkpoint has {recorded!r}, this run has {randomness!r}; the dropout "
                              "and every other torch draw of the model would change at the resume")
        if resized:
            mismatches += resize_problems(found, expected, per_rank_data=self.per_rank["data"].per_rank_position())
        if mismatches:
            raise UnusableCheckpointError(
                f"Checkpoint {resolved} does not match this run:\n  - " + "\n  - ".join(mismatches) + "\n"
                "Resume with the same batching (on another world size, the same window of microbatches per update), "
                "objective, EMA, precision, optimizer, scheduler, TrainConfig.model_randomness and model (names, shapes "
                "and dtypes); to change them, start a new run from its weights (load_weights)."
            )
        if found.get("torch_threads") != expected["torch_threads"]:
            warnings.warn(
                f"Checkpoint {resolved} was written with {found.get('torch_threads')} torch threads per process and "
                f"this run uses {expected['torch_threads']}; CPU kernels may round differently, so the continuation "
                "may not be bitwise identical. Set the same OMP_NUM_THREADS (or torch.set_num_threads) to keep it exact.",
                stacklevel=5,
            )

    def restore_per_rank(self, payload: Mapping[str, Any]) -> None:
        ranks, rank, world = payload["ranks"], self.accelerator.process_index, self.accelerator.num_processes
        if len(ranks) != world:  # another world size, which check_fits allowed (see .resize)
            restore_resized(payload, self.per_rank, self.shared["state"], rank, world)
            return
        for key, component in self.per_rank.items():
            component.load_state_dict(ranks[rank].get(key, {}))  # checkpoints older than a component hold none of it

    def _gather(self, states: list[Any]) -> list[list[Any]]:
        if self.accelerator.num_processes == 1:
            return [states]
        return every_rank_value(states, self.accelerator)


def resume_source(path: Path) -> tuple[Path, str | None]:
    """The checkpoint to resume from ``path``, and a warning when it is not ``path`` itself.

    A ``last`` pointer that is missing or dangling (a kill between publishing a checkpoint and
    pointing ``last`` at it) falls back to the newest complete checkpoint of its folder, provided
    every checkpoint there belongs to one run.
    """
    path = Path(path)
    if path.exists() or path.name != Pointer.LAST:
        return path, None
    directory = CheckpointDirectory(path.parent)
    newest = directory.newest_complete()
    if newest is None:
        return path, None  # read_checkpoint explains that nothing was published
    runs = directory.run_ids()
    if len(runs) > 1:
        raise CheckpointError(
            f"{path} does not exist and {directory.path} holds checkpoints of {len(runs)} different runs, so the "
            "newest one may belong to another run. Pass the checkpoint file to resume from, or give each run its "
            "own checkpoint_dir."
        )
    state = "is dangling" if path.is_symlink() else "does not exist"
    return newest, f"{path} {state} (a stop was interrupted before publishing it); resuming from {newest}, the newest complete checkpoint of that folder."


def checkpoint_run_id(path: Path) -> str | None:
    """The id of the run that wrote checkpoint ``path`` (None where it cannot be read or records none)."""
    try:  # mmap reads the small pickle, not the tensors
        payload = torch.load(payload_file(Path(path)), map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    return payload.get("run_id") if isinstance(payload, dict) else None


def safe_load_problem(path: Path) -> str | None:
    """Why ``path`` is not a checkpoint ELFES can load safely, in a few words; None for one it can. Reads it with
    ``torch.load(weights_only=True)``, which builds no object the file names (nothing of a planted pickle runs)."""
    try:  # mmap reads the small pickle, not the tensors
        payload = torch.load(payload_file(Path(path)), map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"it holds Python objects that safe loading (torch.load(weights_only=True)) refuses to build: {reason}"
    except Exception as error:  # not a torch archive (a bare pickle, a text), or a damaged one
        return f"it is not a torch checkpoint archive ({type(error).__name__})"
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        return f"it has no '{FORMAT}' marker"
    if Path(path).is_dir():  # a sharded checkpoint: its DCP metadata too, read by the safe unpickler
        try:
            SafeReader(path).read_metadata()
        except ShardDamage as damage:
            return unreadable_message(Path(path).resolve(), damage)
        except (CheckpointError, OSError, EOFError) as error:
            return f"its shards' metadata cannot be read safely: {str(error).split(';')[0]}"
    return None


def _component_state(component: Any, model_to_cpu: bool) -> Any:
    if component is None:
        return None
    if isinstance(component, nn.Module):
        # A payload written before training resumes saves a tensor already on the CPU as it is: copying
        # it first would add a pass over the whole model. A snapshot copies every tensor once, later.
        return {name: tensor.detach().to("cpu") if model_to_cpu else tensor.detach() for name, tensor in component.state_dict().items()}
    return component.state_dict()
