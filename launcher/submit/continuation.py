"""Which fields of a job spec may change when a run continues from its checkpoints, and which may not.

A run that has a checkpoint continues it bitwise-exactly only with the same math. So when ``elfes
submit`` (a changed spec file) or ``elfes resume --set`` brings a spec that differs from the one
recorded in the run directory:

- may change (how long, where and with what it runs): the budget keys of ``config``
  (:data:`BUDGET_KEYS`: ``config.epochs``, ``config.max_steps``, the engine's cumulative
  ``TrainConfig`` limits), ``resources.timeout_min``, ``resources.cpus_per_task``,
  ``resources.mem_gb``, every ``slurm.*`` option, every ``requeue.*`` policy (``max_requeues``,
  ``max_failures``, ``hang_timeout_s``, ``startup_timeout_s``, ``exclude_failed_nodes``) and ``env``;
- may not (what the run computes): every other ``config`` key, ``name``, ``entrypoint``, ``command``,
  ``workdir``, ``run_dir``, ``resources.nodes``, ``resources.tasks_per_node``,
  ``resources.gpus_per_node``.

A run directory without a checkpoint (a submission SLURM refused, user code that failed before its
first save) has nothing to continue: any corrected spec takes it over. Torch-free.
"""

from __future__ import annotations

from ..rundir.paths import RunPaths
from ..spec import JobSpec

BUDGET_KEYS: tuple[str, ...] = ("epochs", "max_steps")
CHANGEABLE_FIELDS: tuple[str, ...] = (
    *(f"config.{key}" for key in BUDGET_KEYS),
    "resources.timeout_min", "resources.cpus_per_task", "resources.mem_gb",
    "slurm", "requeue", "env",
    "snapshot",  # what is copied; the code each attempt ran is in its provenance
)


def may_change(field: str) -> bool:
    """Whether the dotted ``field`` (as :meth:`JobSpec.differences` names it) may change in a continuing run."""
    return any(field == allowed or field.startswith(f"{allowed}.") for allowed in CHANGEABLE_FIELDS)


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


def _is_count(value: object) -> bool:
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
    return [field for field in recorded.differences(new) if not may_change(field)]
