"""What SLURM says of jobs: one job (``squeue``, else ``sacct``), or this user's queued and live jobs in one
``squeue`` (:func:`user_jobs`, :class:`SlurmQueue`), and when jobs could start and started (``sacct``:
:func:`job_starts`). Torch-free; asks, changes nothing.

>>> queue_entry("77")  # doctest: +SKIP
QueueEntry(state='PENDING', reason='BeginTime', restarts=1)
"""

from __future__ import annotations

import getpass
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timezone

from .tools import SlurmError, Tool, answered, run

# squeue states in which a SLURM job is still queued or alive.
ALIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
    "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
})
# The pseudo-state of a job that squeue no longer knows (and sacct has no final state for).
GONE = "GONE"
# How sacct is asked to print times: in UTC and in one format, whatever the user's TZ and SLURM_TIME_FORMAT say
# (sacct prints the local time of its own process, without a zone, in the format SLURM_TIME_FORMAT chooses).
SACCT_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
SACCT_TIME_ENVIRONMENT = {"TZ": "UTC", "SLURM_TIME_FORMAT": SACCT_TIME_FORMAT}


@dataclass(frozen=True)
class QueueEntry:
    """What SLURM says of a job: its state, why it waits (squeue's reason, e.g. ``BeginTime`` after a
    requeue), and how often SLURM restarted it (``RestartCnt``: requeues by preemption, ``scontrol
    requeue``, node failure). ``reason``/``restarts`` are None where only ``sacct`` still knows the job;
    for a job that only ``sacct`` calls alive (state ``GONE``), ``reason`` is what sacct says."""

    state: str
    reason: str | None = None
    restarts: int | None = None

    @property
    def alive(self) -> bool:
        """Whether the job is still queued or alive."""
        return self.state in ALIVE_STATES

    def describe(self) -> str:
        """``"PENDING (BeginTime)"``, or the state alone."""
        return f"{self.state} ({self.reason})" if self.reason else self.state


def _entry(state: str, reason: str, restarts: str) -> QueueEntry:
    reason = reason.strip()
    return QueueEntry(state.strip(), None if reason in ("", "None") else reason,
                      int(restarts) if restarts.strip().isdigit() else None)


def queue_entry(job_id: str) -> QueueEntry | None:
    """SLURM's view of ``job_id`` (``squeue``, else ``sacct``); state ``GONE`` when squeue answers and no
    longer knows it (and sacct has no final state for it); None where neither answers.

    squeue asks the controller, which holds every job that is queued or alive: a job it does not know is
    neither, whatever sacct says. sacct's record can stay REQUEUED for good (a job ``scancel``ed while
    ``scontrol requeue`` was requeueing it, on Slurm 22.05) and is then not trusted.
    """
    queued = run(Tool.SQUEUE, "-h", "-j", job_id, "-O", "State:|,Reason:|,RestartCnt:")
    if queued.ok and queued.stdout.strip():
        state, _, rest = queued.stdout.strip().splitlines()[0].partition("|")
        reason, _, restarts = rest.partition("|")
        return _entry(state, reason, restarts)
    squeue_forgot = queued.started and (queued.ok or "Invalid job id" in queued.stderr)
    accounted = run(Tool.SACCT, "-n", "-X", "-P", "-j", job_id, "-o", "State")
    if accounted.ok and accounted.stdout.strip():
        state = accounted.stdout.splitlines()[-1].split()[0]  # "CANCELLED by 0" -> CANCELLED
        if squeue_forgot and state in ALIVE_STATES:
            return QueueEntry(GONE, reason=f"sacct still says {state}")
        return QueueEntry(state)
    if squeue_forgot:
        return QueueEntry(GONE)  # squeue answered and no longer knows the job
    return None


@dataclass(frozen=True)
class QueuedJob:
    """One line of this user's queue. ``job_id`` as squeue writes it; ``array_job_id``/``array_task_id`` for a
    task of a job array (None otherwise); ``output``: where its standard output goes (only when asked for)."""

    job_id: str
    array_job_id: str | None
    array_task_id: str | None
    entry: QueueEntry
    output: str | None = None

    @property
    def name(self) -> str:
        """The job's id, an array task's as ``<array>_<task>``."""
        return f"{self.array_job_id}_{self.array_task_id}" if self.array_task_id is not None else self.job_id

    @property
    def base_id(self) -> str:
        """The id ``sbatch`` answered for the job: an array task's array id."""
        return self.array_job_id if self.array_job_id is not None else self.job_id.partition("_")[0]


_QUEUE_FIELDS = "JobID:|,ArrayJobID:|,ArrayTaskID:|,State:|,Reason:|,RestartCnt:"


def user_jobs(*, with_output: bool = False) -> tuple[QueuedJob, ...]:
    """This user's queued and live jobs, each array task on its own (``squeue -r``); with ``with_output``, where
    each writes its standard output. Raises :class:`SlurmError` where squeue does not answer."""
    fields = _QUEUE_FIELDS + ("|,StdOut:4096" if with_output else "")
    queued = answered(run(Tool.SQUEUE, "-h", "-r", "-u", getpass.getuser(), "-O", fields))
    count = 7 if with_output else 6
    jobs = []
    for line in queued.stdout.splitlines():
        parts = [part.strip() for part in line.split("|", count - 1)]
        if len(parts) != count:
            continue
        job_id, array_job, array_task, state, reason, restarts = parts[:6]
        in_array = array_job.isdigit() and array_task.isdigit()
        jobs.append(QueuedJob(job_id, array_job if in_array else None, array_task if in_array else None,
                              _entry(state, reason, restarts), parts[6] if with_output else None))
    return tuple(jobs)


class SlurmQueue:
    """One ``squeue`` for many runs: this user's queued and live jobs by id (an array task as
    ``<array>_<task>``), asked once at the first lookup, so that ``elfes status`` of a sweep asks the
    controller once, not once per member."""

    def __init__(self) -> None:
        self._entries: dict[str, QueueEntry] | None = None
        self._asked = False

    def entry(self, job_id: str) -> QueueEntry | None:
        """SLURM's view of ``job_id``: from the queue, else (a job that left it, or squeue did not answer)
        as :func:`queue_entry` tells it."""
        if not self._asked:
            self._asked = True
            try:
                self._entries = {job.name: job.entry for job in user_jobs()}
            except SlurmError:
                self._entries = None
        found = self._entries.get(job_id) if self._entries is not None else None
        return found if found is not None else queue_entry(job_id)


@dataclass(frozen=True)
class JobStart:
    """One start of a job as SLURM's accounting records it (a requeued job has one per start): when the scheduler
    let it start (``Eligible``: its submission, or the end of a requeue's ``BeginTime`` hold) and when it started
    (``Start``; None while it waits)."""

    eligible_at: datetime
    started_at: datetime | None


def job_starts(job_ids: Collection[str]) -> dict[str, tuple[JobStart, ...]] | None:
    """Every recorded start of each of ``job_ids`` (one ``sacct --duplicates``), by job id as the launcher writes
    it (an array task as ``<array>_<task>``), oldest first; None where accounting does not answer."""
    if not job_ids:
        return {}
    accounted = run(Tool.SACCT, "-n", "-X", "-D", "-P", "-j", ",".join(sorted(job_ids)), "-o", "JobID,Eligible,Start",
                    environment=SACCT_TIME_ENVIRONMENT)
    if not accounted.ok:
        return None
    starts: dict[str, list[JobStart]] = {}
    for line in accounted.stdout.splitlines():
        job_id, eligible, started = (line.split("|") + ["", ""])[:3]
        eligible_at = _accounted_time(eligible)
        if eligible_at is not None:
            starts.setdefault(job_id.strip(), []).append(JobStart(eligible_at, _accounted_time(started)))
    return {job_id: tuple(sorted(found, key=lambda start: start.eligible_at)) for job_id, found in starts.items()}


def _accounted_time(text: str) -> datetime | None:
    """A time as sacct prints it under :data:`SACCT_TIME_ENVIRONMENT` (UTC, without a zone), or None for
    ``Unknown``/``None``."""
    try:
        return datetime.strptime(text.strip(), SACCT_TIME_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None

