"""The backends a run's jobs run on, registered in one place (:data:`BACKENDS`), selected by the typed
:class:`Executor`. A third backend is a module of this package implementing :class:`Backend`, a member of
:class:`Executor`, one line here, and its submission in launcher/submit/executors.py (docs/where-things-live.md).
Torch-free.

>>> backend_for("slurm").relaunch_exit_code  # doctest: +SKIP
0
"""

from __future__ import annotations

from ..errors import EXIT_BAD_INPUT, ElfesError
from ..slurm import slurm_available
from .base import Backend, Executor
from .local import LocalBackend
from .slurm import SlurmBackend

BACKENDS: dict[Executor, Backend] = {Executor.SLURM: SlurmBackend(), Executor.LOCAL: LocalBackend()}
# The executors a run may record, and what a command line may ask for (``auto`` chooses one of them).
RUN_EXECUTORS = tuple(executor.value for executor in BACKENDS)
CHOICES = (Executor.AUTO.value, *RUN_EXECUTORS)

__all__ = ["BACKENDS", "CHOICES", "RUN_EXECUTORS", "Backend", "Executor", "ExecutorError", "backend_for",
           "choose_executor"]


class ExecutorError(ElfesError, ValueError):
    """The spec cannot run on the chosen executor (bad input: nothing was created)."""

    exit_code = EXIT_BAD_INPUT


def executor_of(name: str | Executor) -> Executor:
    """The :class:`Executor` named ``name`` (ExecutorError naming the choices when none is)."""
    try:
        return Executor(name)
    except ValueError:
        raise ExecutorError(f"executor {str(name)!r} is unknown; use one of {', '.join(CHOICES)}") from None


def backend_for(executor: str | Executor) -> Backend:
    """The backend of ``executor`` (a run's recorded one; ``auto`` is chosen first: :func:`choose_executor`)."""
    chosen = executor_of(executor)
    if chosen not in BACKENDS:
        raise ExecutorError(f"executor {chosen.value!r} names no backend; choose one first "
                            f"({', '.join(RUN_EXECUTORS)})")
    return BACKENDS[chosen]


def choose_executor(requested: str | Executor) -> Executor:
    """The executor of ``requested`` (``auto``: SLURM where :func:`slurm_available`, else local)."""
    chosen = executor_of(requested)
    if chosen == Executor.AUTO:  # the one choice that is no backend
        return Executor.SLURM if slurm_available() else Executor.LOCAL
    return chosen
