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
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from elfes.contract import POINTERS, CheckpointName, Pointer
from elfes.files import TEMPORARY_PREFIX, atomic_writer, fsync_directory, replace_symlink

from .payload import CheckpointError as CheckpointError  # re-exported: its home for callers
from .payload import ShardDamage, UnusableCheckpointError

if TYPE_CHECKING:
    from .dcp_reader import SafeReader

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
            check_shards(resolved, shards)
        except ShardDamage as damage:
            raise UnusableCheckpointError(unreadable_message(resolved, damage)) from None
    return payload


def check_shards(folder: Path, shards: SafeReader | None = None) -> None:
    """Read sharded checkpoint ``folder``'s DCP metadata through the allow-listed reader ``shards`` (a new one when
    none is given), which checks every shard file is there in full: :class:`ShardDamage` for a damaged folder, an
    :class:`UnusableCheckpointError` for one ELFES did not write. DCP is imported here, by a sharded checkpoint's
    reader only."""
    if shards is None:
        from .dcp_reader import SafeReader

        shards = SafeReader(folder)
    shards.read_metadata()


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
            check_shards(path)
        return intact
    except (zipfile.BadZipFile, OSError, EOFError, CheckpointError):
        return False



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
            check_shards(Path(path))
        except ShardDamage as damage:
            return unreadable_message(Path(path).resolve(), damage)
        except (CheckpointError, OSError, EOFError) as error:
            return f"its shards' metadata cannot be read safely: {str(error).split(';')[0]}"
    return None

