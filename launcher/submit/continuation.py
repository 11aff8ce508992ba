"""Which fields of a job spec may change when a run continues from its checkpoints, and which may not.

A run that has a checkpoint continues it bitwise-exactly only with the same math. So when ``elfes
submit`` (a changed spec file) or ``elfes resume --set`` brings a spec that differs from the one
recorded in the run directory, only the fields that may change (how long, where and with what it runs)
may differ; the others (what the run computes) are refused by name. Each field of the models declares
which it is (launcher/spec/continuing.py); docs/job-spec.md lists them from the same declarations. The
budget keys of ``config`` (:data:`BUDGET_KEYS`, the engine's cumulative ``TrainConfig`` limits) are
the keys of ``config`` that may change.

A run directory without a checkpoint (a submission SLURM refused, user code that failed before its
first save) has nothing to continue: any corrected spec takes it over. Torch-free.
"""

from __future__ import annotations

from typing import TypeGuard

from elfes.world_size import world_size_problems

from ..rundir.checkpoint_layout import last_checkpoint_layout
from ..rundir.paths import RunPaths
from ..spec import JobSpec
from ..spec.continuing import changeable, changeable_keys, may_change

BUDGET_KEYS: tuple[str, ...] = changeable_keys("config")
CHANGEABLE_FIELDS: tuple[str, ...] = tuple(changeable())


def has_checkpoints(paths: RunPaths) -> bool:
    """Whether the run saved anything a continuation would start from (``last``, or any checkpoint)."""
    folder = paths.checkpoints
    return folder.is_dir() and any(not entry.name.startswith(".") for entry in folder.iterdir())


def budget_raised(recorded: JobSpec, new: JobSpec) -> bool:
    """Whether ``new`` allows more training than ``recorded``: a budget key raised, lifted
    (``max_steps: null``) or added/removed (the entrypoint's default then decides)."""
    for key in BUDGET_KEYS:
        if (key in recorded.config) != (key in new.config):
            return True
        before, after = recorded.config.get(key), new.config.get(key)
        if before == after:
            continue
        if key == "max_steps" and after is None:
            return True
        if _is_count(before) and _is_count(after) and after > before:
            return True
    return False


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def extend_hint(paths: RunPaths, recorded: JobSpec) -> str:
    """The ``elfes resume --set`` line that would train a finished run further: twice the budget it
    ``recorded`` (not what a refused ``--set`` gave, which may be below it)."""
    epochs = recorded.config.get("epochs")
    max_steps = recorded.config.get("max_steps")
    if _is_count(max_steps):
        return f"elfes resume {paths.run_dir} --set config.max_steps={2 * max_steps}"
    if _is_count(epochs):
        return f"elfes resume {paths.run_dir} --set config.epochs={2 * epochs}"
    return f"elfes resume {paths.run_dir} --set config.epochs=N"


def refused_changes(recorded: JobSpec, new: JobSpec, paths: RunPaths) -> list[str]:
    """The differing fields that may not change, given what the run directory holds (none without a
    checkpoint)."""
    if not has_checkpoints(paths):
        return []
    refused = [field for field in recorded.differences(new) if not may_change(field)]
    if (recorded.resources.gpus_per_node == 0) != (new.resources.gpus_per_node == 0):
        # The number of GPUs may change with the world size, but not whether there are any: CPUs and GPUs
        # compute differently, and a checkpoint's CUDA generators have no place on CPUs (nor the reverse).
        refused.append(f"resources.gpus_per_node ({recorded.resources.gpus_per_node} -> {new.resources.gpus_per_node}: "
                       "from CPUs to GPUs or back)")
    return refused


def world_size_refusal(recorded: JobSpec, new: JobSpec, paths: RunPaths) -> str | None:
    """Why ``new``'s world size cannot continue the checkpoint ``last`` names, whatever the job's accumulation
    (elfes/world_size.py, the engine's own reasoning, on the layout the run's records tell); None where it can,
    where only the job's accumulation decides (the engine refuses at the resume), or where the records do not tell."""
    if new.world_size == recorded.world_size or not has_checkpoints(paths):
        return None
    found = last_checkpoint_layout(paths)
    if found is None:
        return None
    name, layout = found
    problems = world_size_problems(layout, new.world_size, per_rank_data=layout["per_rank_data"])
    if not problems:
        return None
    return (f"run directory {paths.run_dir} cannot continue on {new.world_size} rank"
            f"{'s' if new.world_size != 1 else ''} (resources.nodes x resources.tasks_per_node) from its checkpoint "
            f"`last` ({name}), so nothing was submitted: " + "; ".join(problems))
