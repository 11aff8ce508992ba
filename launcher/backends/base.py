"""What a backend is: the typed :class:`Executor` and the :class:`Backend` protocol, every duty in which SLURM and
a local run differ. Each backend is one module of this package (``local.py``, ``slurm.py``), registered once in
``launcher/backends/__init__.py``; the rest of the launcher asks ``backend_for(executor)`` and never compares an
executor's name (tests/test_backend_seams.py). Torch-free.

The floors above hand a backend what only they can read (a run's state, its recorded tasks): the backend owns
the decision and the scheduler's commands, the floors own the run directory. How a job reaches the backend
(submitit's executors, the sbatch script) lives in ``launcher/submit/executors.py``, keyed by the same
:class:`Executor`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from elfes.contract import StrEnum

from ..slurm import TOOL_TIMEOUT_S

if TYPE_CHECKING:
    from ..slurm import Answer, JobStart, QueueEntry, SlurmQueue
    from ..spec.models import JobSpec


class Executor(StrEnum):
    """Where a run's jobs run: ``auto`` (SLURM where a cluster answers) is only ever asked for, never recorded."""

    AUTO = "auto"
    SLURM = "slurm"
    LOCAL = "local"


class Backend(Protocol):
    """Every duty in which backends differ. A new backend implements each one (launcher/backends/local.py is the
    smallest example) and is registered in launcher/backends/__init__.py."""

    executor: Executor
    # Liveness: whether its job's processes run on this machine (found in /proc, signalled by pid), as opposed
    # to being looked up in a scheduler's queue; how often a polling loop asks it (a queue loads its controller).
    runs_here: bool
    liveness_every_s: float
    status_poll_s: float
    # A job that stopped on SIGTERM waits for the scheduler to end it, which may requeue it (a preemption): an
    # ended run's job may still be alive, and come back by itself (its restart count grows).
    outlives_its_end: bool
    # The scheduler sends a stop signal to every process of the job itself (a task need not forward a SIGINT).
    signals_every_process: bool
    # Who ends the processes that ignore a stop: the scheduler (its own kill wait) or the task itself.
    kills_stragglers: bool
    # How a relaunch is exited: the status a task leaves with when its job starts again.
    relaunch_exit_code: int
    # A requeue is asked of the scheduler from inside the job (rank 0), not left to the exit status.
    requeues_from_inside: bool
    # A sweep's members are handed to the scheduler at once, as job arrays that it throttles (launcher/commands/
    # sweep/slurm.py); else a scheduler process on this machine starts them as slots free (sweep/local.py).
    sweeps_as_arrays: bool

    def queued(self, job_id: str, snapshot: SlurmQueue | None = None) -> QueueEntry | None:
        """Its job as the scheduler's queue shows it (looked up in ``snapshot``, one query for many runs, when
        given): None when the queue does not know it, or the backend has none (its processes are the job:
        ``runs_here``)."""

    def job_name(self, job_id: str | None) -> str:
        """How a message names one of its jobs ("SLURM job 12")."""

    def jobs_name(self, job_ids: Collection[str]) -> str:
        """How a message names a sweep's hand-over ("SLURM job array 12")."""

    def excludes_failed_nodes(self, spec: JobSpec) -> bool:
        """Whether its jobs leave out the nodes of the run's failures (``--exclude``; ``requeue.exclude_failed_nodes``
        says whether the run wants it)."""

    def restart(self, start_count: Path, *, job: str) -> int:
        """Which start of its job this task is (0: the first): a relaunch counted its way. ``start_count``: this
        rank's file (``RunPaths.start_count``) for a backend that counts them itself; ``job``: the job's id and
        submission number."""

    def resubmits(self, restart: int) -> bool:
        """Whether a requeue at start ``restart`` needs a new submission (the relaunching controller's limit)."""

    def requeue(self, job_id: str) -> str | None:
        """Requeue its job from inside it (rank 0); None when accepted, else why not, with what to do."""

    def exclude(self, job_id: str, hosts: tuple[str, ...]) -> None:
        """Leave ``hosts`` out when its requeued job starts again (only warns when refused)."""

    def end_cancelled(self, job_id: str) -> None:
        """From inside a cancelled job: make sure no requeue brings it back."""

    def end_unretried(self, job_id: str, world_size: int) -> None:
        """From inside a job whose failure is not retried: end the other tasks now (they may wait on the failed
        one)."""

    def signal(self, job_id: str, signal_name: str, *, every_process: bool = False,
               timeout_s: float = TOOL_TIMEOUT_S) -> Answer:
        """From outside, send ``signal_name`` ("USR2": a preemption; "TERM", "KILL": a rehearsal's interruption) to
        its job, with ``every_process`` to the batch shell too. A backend that ``runs_here`` is signalled through
        its tasks' pids (the run directory's records) instead: its answer says it did not run."""

    def cancel(self, job_id: str) -> Answer:
        """From outside, end its job for good (``elfes cancel``, a rehearsal's end); the same for ``runs_here``."""

    def queue_starts(self, job_ids: Collection[str]) -> Mapping[str, tuple[JobStart, ...]]:
        """When the scheduler let each of ``job_ids`` start and when it did (goodput's queue time): empty where it
        keeps no such record."""

