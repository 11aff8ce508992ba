"""What a ``train`` call checks before it trains: the checkpoint folder it will write, and a restored
run's schedule and pointers.

Pure questions of a folder and a restored state, kept out of :class:`~elfes.engine.session.TrainingSession`
so that the session reads as the loop's boundary policy.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from elfes.contract import Pointer
from elfes.files import check_writable_directory
from elfes.refusals import ConfigurationError

from .checkpoint import CheckpointDirectory
from .events import Budget
from .schedule import schedule_horizons


def checkpoint_dir_problem(directory: CheckpointDirectory, *, fresh: bool) -> str | None:
    """Why ``directory`` cannot take this run's checkpoints (not writable; a fresh start among another
    run's checkpoints), or None."""
    try:
        check_writable_directory(directory.path, what="checkpoint_dir")
    except ValueError as error:
        return str(error)
    if fresh and directory.checkpoints():
        path = directory.path
        return (
            f"checkpoint_dir {path} already holds checkpoints, so this fresh start would mix two runs. Continue "
            f"the run they belong to with resume_from={path / 'last'} (which falls back to the newest complete "
            "checkpoint when a kill left `last` missing), or give this run an empty directory."
        )
    return None


def check_schedule_horizons(scheduler: Any, budget: Budget, scheduler_interval: str, restored: Path) -> None:
    """Warn where a restored schedule ends elsewhere than this budget (it was built over another one);
    refuse a ``OneCycleLR`` that this budget would step past its end, which torch refuses mid-run."""
    unit = "step" if scheduler_interval == "step" else "epoch"
    planned = budget.planned_steps
    if unit == "epoch":
        if budget.updates_per_epoch is None:  # a stream without __len__: how many epochs it plans is not known
            return
        planned = math.ceil(planned / budget.updates_per_epoch)
    for horizon in schedule_horizons(scheduler):
        if horizon.steps == planned:
            continue
        built = f"The {horizon.kind} restored from {restored} ends at {unit} {horizon.steps} ({horizon.field})"
        if horizon.kind == "OneCycleLR" and horizon.steps < planned:
            raise ConfigurationError(
                f"{built}, but this run now plans {planned} {unit}s, and torch's OneCycleLR cannot step past its "
                f"end. Keep the budget at {horizon.steps} {unit}s or fewer, or start a new run from its weights.")
        warnings.warn(
            f"{built}, but this run now plans {planned} {unit}s. The checkpoint's schedule is kept, as exact "
            f"continuation requires; to schedule over the new budget, start a new run from its weights.",
            stacklevel=5,
        )


def repair_pointers(directory: CheckpointDirectory, restored: Path, best: Path | None) -> None:
    """Point ``best`` at the state's best checkpoint and ``last`` at the restored one when a kill
    between two pointer updates left them stale (no file is touched when they are right)."""
    if best is not None and best.exists():
        directory.point(Pointer.BEST, best)
    last = directory.pointer(Pointer.LAST)
    if not last.exists() and restored.parent == directory.path.resolve():
        directory.point(Pointer.LAST, restored)
