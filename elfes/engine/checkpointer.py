"""Checkpointers: what saves a run's components into a checkpoint and restores them, behind one protocol.

:class:`Checkpointer` is what a training session asks of one; :class:`FileCheckpointer` writes one file from the
main process, the sharded one (:class:`~elfes.engine.sharded.ShardedCheckpointer`) a folder of shards from every
rank. Both hold a :class:`CheckpointContents`: the run's components (:mod:`.components`), the layout a resuming run
must share with the checkpoint, and what saving and restoring them takes besides the model's tensors.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from accelerate import Accelerator

from elfes.contract import CheckpointName
from elfes.world_size import PER_WORLD_LAYOUT, resize_problems, window

from .checkpoint import FORMAT, VERSION, CheckpointDirectory, read_checkpoint
from .collectives import every_rank_value
from .components import Component, PerRankComponent, Resize, SharedComponent
from .payload import TensorCopy, UnusableCheckpointError, model_mismatches, plain_payload

# Layout entries that change rounding but not meaning: a mismatch warns instead of refusing.
_ADVISORY_LAYOUT = ("torch_threads",)


class PendingWrite(Protocol):
    """A checkpoint whose states are taken, ready to be written (by :func:`~elfes.engine.publish.publish`)."""

    @property
    def directory(self) -> CheckpointDirectory: ...

    @property
    def main(self) -> bool: ...

    @property
    def every_rank_writes(self) -> bool: ...

    @property
    def path(self) -> Path: ...

    def write(self) -> tuple[Path, int]:
        """Publish it atomically; its path and size in bytes (0 on a rank that wrote nothing)."""
        ...


class Checkpointer(Protocol):
    """Saves and restores everything that must survive a restart. Every rank calls :meth:`snapshot` (then
    ``write()`` it) and :meth:`restore`."""

    @property
    def sharded(self) -> bool:
        """Whether its checkpoints are folders of shards (:attr:`~elfes.contract.CheckpointName.sharded`)."""
        ...

    def layout(self) -> dict[str, Any]:
        """What a resuming run must share with the checkpoint."""
        ...

    def components(self) -> dict[str, Any]:
        """Every checkpointed object by its component's name (None where a part is absent, e.g. no EMA)."""
        ...

    def snapshot(self, directory: CheckpointDirectory, name: CheckpointName, *, reuse: bool, run_id: str | None,
                 copy: TensorCopy | None = None) -> PendingWrite:
        """The collective part of saving checkpoint ``name`` (kept as it is when ``reuse``). Without ``copy`` the
        states are live and written before training resumes; with it, each tensor is ``copy(tensor, where)``."""
        ...

    def restore(self, source: Path) -> dict[str, Any]:
        """Check that checkpoint ``source`` fits this run, then load every component from it; its payload."""
        ...


class CheckpointContents:
    """A run's checkpoint components (each name once), its ``layout``, and how both checkpointers save, check and
    restore them. A :class:`~elfes.engine.components.SharedComponent` is saved by the main process; a
    :class:`~elfes.engine.components.PerRankComponent` is gathered from every rank."""

    def __init__(self, accelerator: Accelerator, components: Sequence[Component],
                 layout: Callable[[], dict[str, Any]]) -> None:
        unknown = [type(component).__name__ for component in components
                   if not isinstance(component, (SharedComponent, PerRankComponent))]
        if unknown:
            raise TypeError(f"A checkpoint component is a SharedComponent or a PerRankComponent (elfes/engine/"
                            f"components.py); got {', '.join(unknown)}. Wrap each part in one of them.")
        names = [component.name for component in components]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"Checkpoint components {repeated} are named twice; give each component its own name.")
        self.accelerator = accelerator
        self.shared = [component for component in components if isinstance(component, SharedComponent)]
        self.per_rank = [component for component in components if isinstance(component, PerRankComponent)]
        self.layout = layout

    def parts(self) -> dict[str, Any]:
        """Every checkpointed object by its component's name."""
        components: list[Component] = [*self.shared, *self.per_rank]
        return {component.name: component.part for component in components}

    def part(self, name: str) -> Any:
        return self.parts()[name]

    def header(self, run_id: str | None) -> dict[str, Any]:
        """What every payload starts with: the format's marker and version, the run id, the layout."""
        return {"format": FORMAT, "version": VERSION, "run_id": run_id, "layout": self.layout()}

    def shared_states(self, *, on_cpu: bool, leave_out: Collection[str] = ()) -> dict[str, Any]:
        return {component.name: component.state(on_cpu=on_cpu) for component in self.shared
                if component.name not in leave_out}

    def rank_states(self, *, on_cpu: bool) -> list[dict[str, Any]]:
        """Every rank's per-rank states, by component name (a collective: every rank calls it)."""
        states = [component.state(on_cpu=on_cpu) for component in self.per_rank]
        return [{component.name: state for component, state in zip(self.per_rank, saved)}
                for saved in every_rank_value(states, self.accelerator)]

    def check_fits(self, payload: Mapping[str, Any], resolved: Path, mismatches: list[str]) -> None:
        """Refuse checkpoint ``resolved`` whose layout, model randomness, model (``mismatches``) or, on another world
        size, a component that cannot be taken over does not fit this run."""
        expected, found = self.layout(), payload["layout"]
        resized = len(payload["ranks"]) != self.accelerator.num_processes
        unchecked = _ADVISORY_LAYOUT + (PER_WORLD_LAYOUT if resized else ())  # a resize checks them as one window
        mismatches = [f"{key}: the checkpoint has {found.get(key)!r}, this run has {expected[key]!r}"
                      for key in expected if key not in unchecked and found.get(key) != expected[key]] + mismatches
        recorded, randomness = payload["progress"].get("model_randomness"), self.part("progress").model_randomness
        if recorded is not None and recorded != randomness:  # None: a checkpoint older than the record, taken as it is
            mismatches.append(f"model_randomness: the checkpoint has {recorded!r}, this run has {randomness!r}; the dropout "
                              "and every other torch draw of the model would change at the resume")
        if resized:
            mismatches += resize_problems(found, expected, per_rank_data=None)
            if window(found) == window(expected):  # a changed window is refused as a whole, before any component
                problems = [component.resize_problem() for component in self.per_rank]
                mismatches += [problem for problem in problems if problem is not None]
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

    def restore(self, payload: Mapping[str, Any], *, leave_out: Collection[str] = ()) -> None:
        """Load every component but ``leave_out`` (which the checkpointer loads itself) from ``payload``; on another
        world size each component takes over the old ranks' states (:meth:`check_fits` admitted every one)."""
        ranks, rank, world = payload["ranks"], self.accelerator.process_index, self.accelerator.num_processes
        resize = Resize(payload, rank, world) if len(ranks) != world else None
        for shared in self.shared:
            if shared.name in leave_out:
                continue
            if resize is None:
                shared.load(payload[shared.name])
            else:
                shared.load_resized(payload[shared.name], resize)
        for component in self.per_rank:  # a checkpoint older than a component holds none of it
            if resize is None:
                component.load(ranks[rank].get(component.name, {}))
            else:
                component.load_resized([old.get(component.name, {}) for old in ranks], resize)


@dataclass(frozen=True)
class PendingCheckpoint:
    """A single-file checkpoint whose payload is built (``payload`` is None where nothing is written: on the other
    ranks, and when the file already holds this position)."""

    directory: CheckpointDirectory
    name: CheckpointName
    payload: dict[str, Any] | None
    main: bool
    every_rank_writes = False  # the main process writes the file

    @property
    def path(self) -> Path:
        return self.directory.file(self.name)

    def write(self) -> tuple[Path, int]:
        if not self.main:
            return self.path, 0
        if self.payload is None:
            return self.path, self.path.stat().st_size
        return self.directory.save(self.payload, self.name)


class FileCheckpointer:
    """Checkpoints as one file each, written by the main process: every component's state in one payload."""

    sharded = False

    def __init__(self, contents: CheckpointContents) -> None:
        self.contents = contents

    def layout(self) -> dict[str, Any]:
        return self.contents.layout()

    def components(self) -> dict[str, Any]:
        return self.contents.parts()

    def snapshot(self, directory: CheckpointDirectory, name: CheckpointName, *, reuse: bool, run_id: str | None,
                 copy: TensorCopy | None = None) -> PendingCheckpoint:
        contents = self.contents
        ranks = contents.rank_states(on_cpu=copy is None)
        main = contents.accelerator.is_main_process
        if not main or (reuse and directory.file(name).exists()):
            return PendingCheckpoint(directory, name, None, main)
        payload = {**contents.header(run_id), **contents.shared_states(on_cpu=copy is None), "ranks": ranks}
        return PendingCheckpoint(directory, name, plain_payload(payload, copy=copy), main)

    def restore(self, source: Path) -> dict[str, Any]:
        payload = read_checkpoint(source)
        model = self.contents.part("model").state_dict()
        # A checkpoint without a model entry keeps its tensors elsewhere: its layout names how it differs.
        mismatches = model_mismatches(payload["model"], model) if "model" in payload else []
        self.contents.check_fits(payload, Path(source).resolve(), mismatches)
        self.contents.restore(payload)
        return payload
