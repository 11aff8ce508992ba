"""What ``state.json`` holds: the run's status, its submissions and attempts, as frozen records, and the
words they use (:class:`RunStatus`, :class:`Outcome`, :class:`Launch`: ``str`` enums, written to the file as
their strings). Torch-free; the transitions are launcher/rundir/state_transitions.py's, the file
launcher/rundir/state.py's.

Requeues are counted from the attempts: an attempt whose ``launch`` is ``"requeue"`` used one (a
relaunch by the job itself, by SLURM after a preemption or node failure (``SLURM_RESTART_COUNT``),
or a resubmission past submitit's local start limit). ``elfes submit``/``resume`` use none. The
relaunch after a failed attempt that was retried (its :class:`Failure` says ``retried``) counts against
``requeue.max_failures`` instead (:attr:`RunState.failures_used`), not against the requeues; those are counted
since the run was last handed over by hand, so that ``elfes resume`` after fixing a cause has the allowance again.

``excluded_nodes`` (:class:`ExcludedNode`) are the hosts a SLURM run leaves out after a rank died or hung
there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from elfes.contract import StrEnum

from ..backends import RUN_EXECUTORS, Executor
from ..errors import RunDamaged
from .json_fields import FieldError, read_record
from .provenance import Provenance, RankPlace

FORMAT_VERSION = 1


class RunStatus(StrEnum):
    """Where a run is (``RunState.status``); the state machine is launcher/rundir/state_transitions.py's."""

    SUBMITTED = "submitted"
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    REQUEUED = "requeued"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"
    CANCELLED = "cancelled"


STATUSES: tuple[RunStatus, ...] = tuple(RunStatus)
# States in which no job of the run is alive or queued: `elfes submit`/`resume` may submit again (a
# finished run only with a raised budget, which the submitter checks).
ENDED: frozenset[RunStatus] = frozenset({RunStatus.FINISHED, RunStatus.STOPPED, RunStatus.FAILED, RunStatus.CANCELLED})


class Outcome(StrEnum):
    """How an attempt ended. ``LOST``: it never recorded an end (killed, node failure); the next start or
    ``elfes status`` noticed."""

    FINISHED = "finished"
    REQUEUED = "requeued"
    STOPPED = "stopped"
    CANCELLED = "cancelled"
    FAILED = "failed"
    LOST = "lost"


OUTCOMES: tuple[Outcome, ...] = tuple(Outcome)
STATUS_AFTER: dict[Outcome, RunStatus] = {
    Outcome.FINISHED: RunStatus.FINISHED, Outcome.REQUEUED: RunStatus.REQUEUED, Outcome.STOPPED: RunStatus.STOPPED,
    Outcome.CANCELLED: RunStatus.CANCELLED, Outcome.FAILED: RunStatus.FAILED, Outcome.LOST: RunStatus.FAILED,
}


class Launch(StrEnum):
    """How a submission or an attempt came about: ``elfes submit``, ``elfes resume``, or a relaunch (by the job,
    by SLURM, or a local resubmission past submitit's start limit)."""

    SUBMIT = "submit"
    RESUME = "resume"
    REQUEUE = "requeue"


LAUNCHES: tuple[Launch, ...] = tuple(Launch)


class FailureCategory(StrEnum):
    """What kind of failure ended an attempt (``Failure.category``, a rank's ``FailureReport.category``)."""

    EXCEPTION = "exception"  # user code raised
    EXIT = "exit"  # a nonzero exit: a command's, or a rank's sys.exit
    LOST = "lost"  # a rank's peer vanished: killed, or its node failed
    HANG = "hang"  # no update boundary for requeue.hang_timeout_s


FAILURE_CATEGORIES: tuple[FailureCategory, ...] = tuple(FailureCategory)
# Fields checked against their words on reading (the enum fields check themselves).
_FIELD_CHOICES = {"executor": tuple(sorted(RUN_EXECUTORS))}


def now() -> str:
    """The current UTC time as ISO 8601 with seconds, the format of every time in ``state.json``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Submission:
    """One hand-over of the run to an executor: ``elfes submit``, ``elfes resume``, or a local job's
    resubmission past submitit's start limit (``kind="requeue"``)."""

    at: str
    executor: Executor
    kind: Launch
    job_id: str | None = None
    host: str | None = None  # the submitter's host and pid: what traces a hand-over a kill cut short
    pid: int | None = None
    error: str | None = None  # why it never got a job
    # A sweep member handed over in a job array: the submitit folder its job's output goes to (the
    # sweep's), and its task in the array (None for a plain job): what finds a job a kill left unrecorded.
    submitit_folder: str | None = None
    array_task: int | None = None


@dataclass(frozen=True)
class Failure:
    """Why an attempt failed and whether it was retried (launcher/job/failures.py decides).

    ``category``: what kind of failure (:class:`FailureCategory`); ``cause``: the error as the failing rank saw it
    (``"RuntimeError: boom"``); ``rank``/``host``: where; ``step``: the step it failed at (the update being computed), if
    known; ``updated``: whether the attempt reached an update boundary before it failed;
    ``retried``: requeued from ``last`` (else the run ended failed); ``reason``: why it was not retried;
    ``nodes``: the hosts where a rank died or hung (:func:`launcher.job.failures.failed_nodes`; empty when
    that cannot be told), which a SLURM run excludes from its later attempts (:class:`ExcludedNode`).
    """

    category: FailureCategory
    cause: str
    retried: bool
    rank: int | None = None
    host: str | None = None
    step: int | None = None
    updated: bool = False
    reason: str | None = None
    nodes: tuple[str, ...] = ()

    def same_as(self, other: Failure) -> bool:
        """The same error at the same step (a failure that repeats is not retried)."""
        return (self.category, self.cause, self.step) == (other.category, other.cause, other.step)


@dataclass(frozen=True)
class ExcludedNode:
    """A host left out of the run's later SLURM jobs (``ExcNodeList`` of the requeued job, ``--exclude`` of
    a resubmission) because a rank died or hung there in attempt ``attempt`` (``requeue.exclude_failed_nodes``).
    ``elfes resume --include-nodes`` allows it again."""

    host: str
    attempt: int
    at: str
    cause: str  # the failure's cause as its attempt recorded it


@dataclass(frozen=True)
class Attempt:
    """One start of the job (all its ranks together), numbered from 1 across the whole run.

    ``token`` identifies the start on every rank (job id and restart number), so that ranks that
    read ``state.json`` before or after rank 0 recorded the attempt agree on its number.
    ``launch`` is how it came about: "submit", "resume" (the first start of such a submission) or
    "requeue" (a relaunch; it used one requeue).
    """

    number: int
    token: str
    job_id: str
    launch: Launch
    started_at: str
    hosts: tuple[str, ...] = ()
    world_size: int = 1
    ended_at: str | None = None
    outcome: Outcome | None = None  # once ended
    signal: str | None = None  # the signal that ended it (e.g. "SIGUSR2"), if one did
    step: int | None = None  # the optimizer step saved in `last` when it ended, if known
    error: str | None = None  # why it failed, or why a stop could not requeue
    provenance: Provenance | None = None  # what it ran on (launcher/rundir/provenance.py), once rank 0 recorded it
    rank_places: tuple[RankPlace, ...] = ()  # each rank's host and device, by rank, once that rank recorded it
    failure: Failure | None = None  # a failed attempt's cause and whether it was retried

    @property
    def ended(self) -> bool:
        return self.outcome is not None


@dataclass(frozen=True)
class RunState:
    """The content of ``state.json``. Build it with launcher/rundir/state_transitions.py's functions."""

    status: RunStatus
    executor: Executor
    max_requeues: int
    job_id: str | None = None
    submissions: tuple[Submission, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    stopping_signal: str | None = None  # set while status is "stopping"
    excluded_nodes: tuple[ExcludedNode, ...] = ()  # hosts the run's SLURM jobs leave out after failures there
    updated_at: str = field(default_factory=now)
    version: int = FORMAT_VERSION

    @property
    def requeues_used(self) -> int:
        """Relaunches so far (by the job itself, by SLURM, or resubmissions past the local start limit),
        a requeue under way included (its attempt ended "requeued" and the relaunch has not begun yet), except
        those that retried a failed attempt (:attr:`failures_used`)."""
        relaunched = relaunches(self.attempts)
        last = self.last_attempt
        under_way = last is not None and last.outcome == Outcome.REQUEUED and self.status not in ENDED
        return relaunched + under_way

    @property
    def failures_used(self) -> int:
        """Failed attempts retried since the run was last handed over by hand (``elfes submit`` or ``resume``):
        ``requeue.max_failures`` caps them, and a resume after "fix the cause" grants the allowance again.
        0 while such a hand-over waits for its first start."""
        if self._hand_over_waits:
            return 0
        return failures_since_hand_over(self.attempts)

    @property
    def failures_counted_since(self) -> Launch:
        """The hand-over :attr:`failures_used` counts from: "submit" or "resume"."""
        if self._hand_over_waits:
            return self.submissions[-1].kind
        return next((a.launch for a in reversed(self.attempts) if a.launch != Launch.REQUEUE), Launch.SUBMIT)

    @property
    def _hand_over_waits(self) -> bool:
        """An ``elfes submit`` or ``resume`` is recorded and its job has not started yet."""
        return self.status in _HANDED_OVER and bool(self.submissions) and self.submissions[-1].kind != Launch.REQUEUE

    @property
    def excluded_hosts(self) -> tuple[str, ...]:
        """The hosts of :attr:`excluded_nodes`, in the order they were excluded."""
        return tuple(node.host for node in self.excluded_nodes)

    @property
    def requeues_left(self) -> int:
        return max(0, self.max_requeues - self.requeues_used)

    @property
    def last_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def error(self) -> str | None:
        """The error message of the latest attempt when it failed (or could not requeue), else None."""
        attempt = self.last_attempt
        return attempt.error if attempt is not None else None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["requeues_used"] = self.requeues_used  # derived; written for readers of the raw file
        data["requeues_left"] = self.requeues_left
        data["failures_used"] = self.failures_used
        return data

    @classmethod
    def from_json(cls, data: Any) -> RunState:
        """The state in ``data`` (state.json's content); :class:`FieldError` names a field that does not fit,
        :class:`RunDamaged` a format version this elfes does not read."""
        if isinstance(data, dict) and isinstance(data.get("version"), int) and data["version"] != FORMAT_VERSION:
            raise RunDamaged(f"has format version {data['version']}; this elfes reads {FORMAT_VERSION}: use the elfes "
                             "version that wrote it")
        if isinstance(data, dict):
            data = {key: value for key, value in data.items() if key not in _DERIVED}
        state = read_record(cls, data, choices=_FIELD_CHOICES)  # FieldError (a ValueError) names the field
        if state.max_requeues < 0:
            raise FieldError(f"max_requeues is {state.max_requeues}, not an integer >= 0")
        return state


_HANDED_OVER = (RunStatus.SUBMITTED, RunStatus.PENDING)  # a hand-over waits for its first start
_DERIVED = ("requeues_used", "requeues_left", "failures_used")  # written for readers, recomputed on reading


def relaunches(attempts: tuple[Attempt, ...]) -> int:
    """Attempts launched as requeues, except those that retried a failed attempt."""
    return sum(1 for index, attempt in enumerate(attempts)
               if attempt.launch == Launch.REQUEUE and not retries_failure(attempts[:index]))


def failures_since_hand_over(attempts: tuple[Attempt, ...]) -> int:
    """Retried failures among ``attempts`` since the latest one launched by hand (a submit or a resume)."""
    start = max((index for index, attempt in enumerate(attempts) if attempt.launch != Launch.REQUEUE), default=0)
    return sum(1 for attempt in attempts[start:] if attempt.failure is not None and attempt.failure.retried)


def retries_failure(earlier: tuple[Attempt, ...]) -> bool:
    """Whether the attempt after ``earlier`` retries a failure: the latest of them failed and was retried."""
    return bool(earlier) and earlier[-1].failure is not None and earlier[-1].failure.retried
