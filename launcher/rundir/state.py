"""``state.json``: where a run is, its submissions and attempts. Torch-free; pure transitions plus load/save.

Two kinds of process write it, each through :func:`update_state` (a read-modify-write under an
``fcntl.flock`` on ``RunPaths.state_lock``, published with ``elfes.files.write_text_atomically``):
the submitter (``elfes submit``/``resume``/``cancel``, and a local job's rank 0 when it resubmits past
submitit's six starts) and rank 0 of the job (attempt begins, stops, ends). Readers (``elfes status``)
use :func:`load_state` and never lock.

The state machine (``RunState.status``)::

    submitted --(executor accepted, job id known)--> pending --(rank 0 started)--> running
    running --(a stop signal arrived)--> stopping
    running|stopping --> requeued --(relaunch)--> running
    running|stopping --(a failure or hang, retried: "failed (retrying)")--> requeued --(relaunch)--> running
    requeued --(elfes cancel before the relaunch: no attempt will record it)--> cancelled
    running|stopping --> finished | stopped | failed | cancelled     (terminal until `elfes resume`)
    submitted --(its submitter was killed before the executor took it; no job of it found)--> failed
    stopped|failed|cancelled|finished (a raised budget) --(elfes resume)--> submitted
    stopped --(SLURM requeued a job that stopped on SIGTERM and waited: a preemption)--> requeued

A transition is a pure function ``RunState -> RunState`` (it returns a new object and refuses an
impossible move with :class:`StateError`), so the submitter and the job share them:

>>> paths = RunPaths(run_dir)  # doctest: +SKIP
>>> update_state(paths, lambda s: record_submission(s, executor="local", kind="submit", max_requeues=20))  # doctest: +SKIP
>>> update_state(paths, lambda s: mark_pending(s, job_id="4242"))  # doctest: +SKIP
>>> state = load_state(paths)  # doctest: +SKIP
>>> state.status, state.requeues_used, state.requeues_left  # doctest: +SKIP
('pending', 0, 20)

Requeues are counted from the attempts: an attempt whose ``launch`` is ``"requeue"`` used one (a
relaunch by the job itself, by SLURM after a preemption or node failure (``SLURM_RESTART_COUNT``),
or a resubmission past submitit's local start limit). ``elfes submit``/``resume`` use none. The
relaunch after a failed attempt that was retried (its :class:`Failure` says ``retried``) counts against
``requeue.max_failures`` instead (:attr:`RunState.failures_used`), not against the requeues; those are counted
since the run was last handed over by hand, so that ``elfes resume`` after fixing a cause has the allowance again.

``excluded_nodes`` (:class:`ExcludedNode`) are the hosts a SLURM run leaves out after a rank died or hung
there (:func:`exclude_nodes`, by the rank that decided the failure; :func:`include_nodes`, by ``elfes resume
--include-nodes``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from elfes.files import exclusive_lock, write_text_atomically

from .json_fields import FieldError, read_record
from .paths import RunPaths, SweepPaths
from .provenance import Provenance

FORMAT_VERSION = 1

Status = Literal["submitted", "pending", "running", "stopping", "requeued", "finished", "stopped", "failed", "cancelled"]
STATUSES: tuple[str, ...] = (
    "submitted", "pending", "running", "stopping", "requeued", "finished", "stopped", "failed", "cancelled",
)
# States in which no job of the run is alive or queued: `elfes submit`/`resume` may submit again (a
# finished run only with a raised budget, which the submitter checks).
ENDED: frozenset[str] = frozenset({"finished", "stopped", "failed", "cancelled"})

Outcome = Literal["finished", "requeued", "stopped", "cancelled", "failed", "lost"]
# How an attempt ended. "lost": it never recorded an end (killed, node failure); the next start or
# `elfes status` noticed.
OUTCOMES: tuple[str, ...] = ("finished", "requeued", "stopped", "cancelled", "failed", "lost")
_STATUS_AFTER: dict[str, str] = {
    "finished": "finished", "requeued": "requeued", "stopped": "stopped", "cancelled": "cancelled",
    "failed": "failed", "lost": "failed",
}

Launch = Literal["submit", "resume", "requeue"]
LAUNCHES: tuple[str, ...] = ("submit", "resume", "requeue")
FAILURE_CATEGORIES: tuple[str, ...] = ("exception", "exit", "lost", "hang")
_FIELD_CHOICES = {"status": STATUSES, "executor": ("local", "slurm"), "kind": LAUNCHES, "launch": LAUNCHES, "outcome": OUTCOMES,
                  "category": FAILURE_CATEGORIES}


class StateError(ValueError):
    """An impossible transition, or a ``state.json`` that cannot be read."""


def now() -> str:
    """The current UTC time as ISO 8601 with seconds, the format of every time in ``state.json``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Submission:
    """One hand-over of the run to an executor: ``elfes submit``, ``elfes resume``, or a local job's
    resubmission past submitit's start limit (``kind="requeue"``)."""

    at: str
    executor: str
    kind: str  # one of LAUNCHES
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

    ``category``: "exception" (user code raised), "exit" (a command's nonzero exit), "lost" (a rank's
    peer vanished: killed, or its node failed), "hang" (no update boundary for
    ``requeue.hang_timeout_s``). ``cause``: the error as the failing rank saw it (``"RuntimeError:
    boom"``); ``rank``/``host``: where; ``step``: the step it failed at (the update being computed), if
    known; ``updated``: whether the attempt reached an update boundary before it failed;
    ``retried``: requeued from ``last`` (else the run ended failed); ``reason``: why it was not retried;
    ``nodes``: the hosts where a rank died or hung (:func:`launcher.job.failures.failed_nodes`; empty when
    that cannot be told), which a SLURM run excludes from its later attempts (:class:`ExcludedNode`).
    """

    category: str  # one of FAILURE_CATEGORIES
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
    launch: str
    started_at: str
    hosts: tuple[str, ...] = ()
    world_size: int = 1
    ended_at: str | None = None
    outcome: str | None = None  # one of OUTCOMES once ended
    signal: str | None = None  # the signal that ended it (e.g. "SIGUSR2"), if one did
    step: int | None = None  # the optimizer step saved in `last` when it ended, if known
    error: str | None = None  # why it failed, or why a stop could not requeue
    provenance: Provenance | None = None  # what it ran on (launcher/rundir/provenance.py), once rank 0 recorded it
    failure: Failure | None = None  # a failed attempt's cause and whether it was retried

    @property
    def ended(self) -> bool:
        return self.outcome is not None


@dataclass(frozen=True)
class RunState:
    """The content of ``state.json``. Build it with the transition functions below."""

    status: str
    executor: str
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
        relaunched = _relaunches(self.attempts)
        last = self.last_attempt
        under_way = last is not None and last.outcome == "requeued" and self.status not in ENDED
        return relaunched + under_way

    @property
    def failures_used(self) -> int:
        """Failed attempts retried since the run was last handed over by hand (``elfes submit`` or ``resume``):
        ``requeue.max_failures`` caps them, and a resume after "fix the cause" grants the allowance again.
        0 while such a hand-over waits for its first start."""
        if self.status in ("submitted", "pending") and self.submissions and self.submissions[-1].kind != "requeue":
            return 0
        return _failures_since_hand_over(self.attempts)

    @property
    def failures_counted_since(self) -> str:
        """The hand-over :attr:`failures_used` counts from: "submit" or "resume"."""
        if self.submissions and self.submissions[-1].kind != "requeue" and self.status in ("submitted", "pending"):
            return self.submissions[-1].kind
        return next((a.launch for a in reversed(self.attempts) if a.launch != "requeue"), "submit")

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
        """The state in ``data`` (state.json's content); :class:`StateError` names a field that does not fit."""
        if isinstance(data, dict) and isinstance(data.get("version"), int) and data["version"] != FORMAT_VERSION:
            raise StateError(f"has format version {data['version']}; this elfes reads {FORMAT_VERSION}: use the elfes "
                             "version that wrote it")
        if isinstance(data, dict):
            data = {key: value for key, value in data.items() if key not in _DERIVED}
        state = read_record(cls, data, choices=_FIELD_CHOICES)  # FieldError (a ValueError) names the field
        if state.max_requeues < 0:
            raise FieldError(f"max_requeues is {state.max_requeues}, not an integer >= 0")
        return state


_DERIVED = ("requeues_used", "requeues_left", "failures_used")  # written for readers, recomputed on reading


def _relaunches(attempts: tuple[Attempt, ...]) -> int:
    """Attempts launched as requeues, except those that retried a failed attempt."""
    return sum(1 for index, attempt in enumerate(attempts)
               if attempt.launch == "requeue" and not _retries(attempts[:index]))


def _failures_since_hand_over(attempts: tuple[Attempt, ...]) -> int:
    """Retried failures among ``attempts`` since the latest one launched by hand (a submit or a resume)."""
    start = max((index for index, attempt in enumerate(attempts) if attempt.launch != "requeue"), default=0)
    return sum(1 for attempt in attempts[start:] if attempt.failure is not None and attempt.failure.retried)


def _retries(earlier: tuple[Attempt, ...]) -> bool:
    """Whether the attempt after ``earlier`` retries a failure: the latest of them failed and was retried."""
    return bool(earlier) and earlier[-1].failure is not None and earlier[-1].failure.retried


def _replace(state: RunState, **changes: Any) -> RunState:
    return dataclasses.replace(state, updated_at=now(), **changes)


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise StateError(f"{what} must be one of {', '.join(allowed)}; got {value!r}.")


# -- transitions (pure) ---------------------------------------------------------------------------------------


def record_submission(state: RunState | None, *, executor: str, kind: str, max_requeues: int,
                      job_id: str | None = None, host: str | None = None, pid: int | None = None,
                      submitit_folder: str | None = None, array_task: int | None = None,
                      refuse_finished: str | None = None) -> RunState:
    """The submitter (``host``, ``pid``) hands the run to ``executor``: "submitted" ("pending" with ``job_id``).
    ``kind``: "submit", "resume", or "requeue" (a local job's rank 0 past submitit's start limit).
    Refused unless the run ended (:data:`ENDED`), or for "requeue" is requeued; a "submitted" run (a hand-over
    that never recorded its job) is settled first: :func:`mark_pending` or :func:`mark_submission_abandoned`.
    With ``refuse_finished``, a finished run is refused with that message."""
    _check(kind, LAUNCHES, "the submission kind")
    if max_requeues < 0:
        raise StateError(f"max_requeues must be >= 0; got {max_requeues}.")
    submission = Submission(at=now(), executor=executor, kind=kind, job_id=job_id, host=host, pid=pid,
                            submitit_folder=submitit_folder, array_task=array_task)
    status = "submitted" if job_id is None else "pending"
    if state is None:
        if kind != "submit":
            raise StateError(f"a {kind} needs an existing run; this run directory has no state.json yet (use elfes submit).")
        return RunState(status=status, executor=executor, max_requeues=max_requeues, job_id=job_id,
                        submissions=(submission,))
    if refuse_finished is not None and state.status == "finished":
        raise StateError(refuse_finished)  # decided here, under the state lock: the job may have just finished
    allowed = {"submit": ENDED, "resume": ENDED, "requeue": {"requeued"}}[kind]
    if state.status not in allowed:
        raise StateError(
            f"cannot record a {kind} while the run is {state.status}"
            + (f" (job {state.job_id})" if state.job_id else "")
            + ("; an earlier submission has not recorded its job: settle it first." if state.status == "submitted" else
               {"submit": "; wait for it to end or `elfes cancel` it first.",
                "resume": "; only a stopped, cancelled, failed or finished run can be resumed.",
                "requeue": "; only a requeued run is resubmitted."}[kind]))
    return _replace(state, status=status, executor=executor, max_requeues=max_requeues, job_id=job_id,
                    submissions=(*state.submissions, submission), stopping_signal=None)


def mark_submission_abandoned(state: RunState, *, error: str) -> RunState:
    """The latest submission was cut short before it recorded a job, and none exists: it keeps ``error``
    and the run is "failed", so a new submission may follow. No-op unless the run is "submitted"."""
    if state.status != "submitted" or not state.submissions:
        return state
    submissions = (*state.submissions[:-1], dataclasses.replace(state.submissions[-1], error=error))
    return _replace(state, status="failed", job_id=None, submissions=submissions)


def mark_pending(state: RunState, *, job_id: str) -> RunState:
    """The executor accepted the latest submission as ``job_id``. A job that already started keeps its status."""
    if not state.submissions:
        raise StateError("mark_pending needs a recorded submission; call record_submission first.")
    latest = dataclasses.replace(state.submissions[-1], job_id=str(job_id))
    status = "pending" if state.status == "submitted" else state.status
    return _replace(state, status=status, job_id=str(job_id), submissions=(*state.submissions[:-1], latest))


def mark_submission_failed(state: RunState, *, error: str) -> RunState:
    """The executor refused the latest submission (e.g. sbatch failed): the run is failed with ``error``."""
    attempt = Attempt(number=len(state.attempts) + 1, token="submission", job_id=state.job_id or "",
                      launch=state.submissions[-1].kind if state.submissions else "submit",
                      started_at=now(), ended_at=now(), outcome="failed", error=error)
    return _replace(state, status="failed", attempts=(*state.attempts, attempt))


def begin_attempt(
    state: RunState, *, token: str, job_id: str, launch: str, hosts: tuple[str, ...] | list[str], world_size: int
) -> RunState:
    """Rank 0 started attempt ``len(attempts_without(token)) + 1``: status "running".

    A previous attempt that never recorded its end is closed as "lost" first; one of the same job that
    stopped (SIGTERM: it saved and waited) before this requeue launch was requeued by SLURM, and says so.
    Recording the same ``token`` again is a no-op (idempotent).
    """
    _check(launch, LAUNCHES, "launch")
    if any(attempt.token == token for attempt in state.attempts):
        return state
    attempts = list(state.attempts)
    if attempts and not attempts[-1].ended:
        attempts[-1] = dataclasses.replace(
            attempts[-1], ended_at=now(), outcome="lost",
            error=attempts[-1].error or "the attempt ended without recording an outcome (killed, or its node failed)",
        )
    elif attempts and launch == "requeue" and attempts[-1].outcome == "stopped" and attempts[-1].job_id == str(job_id):
        # It stopped on SIGTERM and waited; SLURM requeued the same job (a preemption in PreemptMode=REQUEUE).
        attempts[-1] = dataclasses.replace(attempts[-1], outcome="requeued")
    attempt = Attempt(number=len(attempts) + 1, token=token, job_id=str(job_id), launch=launch, started_at=now(),
                      hosts=tuple(hosts), world_size=world_size)
    return _replace(state, status="running", job_id=str(job_id), attempts=(*attempts, attempt), stopping_signal=None)


def record_provenance(state: RunState, *, token: str, provenance: Provenance) -> RunState:
    """Rank 0 records what the attempt ``token`` runs on (its code and environment). No-op for an unknown token."""
    index = next((i for i, attempt in enumerate(state.attempts) if attempt.token == token), None)
    if index is None:
        return state
    attempt = dataclasses.replace(state.attempts[index], provenance=provenance)
    return _replace(state, attempts=(*state.attempts[:index], attempt, *state.attempts[index + 1:]))


def mark_stopping(state: RunState, *, signal: str | None) -> RunState:
    """A stop was requested (``signal``, e.g. "SIGUSR2"); the job is saving ``last``. Only from "running"."""
    if state.status != "running":
        return state
    return _replace(state, status="stopping", stopping_signal=signal)


def end_attempt(
    state: RunState,
    *,
    token: str,
    outcome: str,
    signal: str | None = None,
    step: int | None = None,
    error: str | None = None,
    failure: Failure | None = None,
) -> RunState:
    """Rank 0 (or, for a failure, the first rank that failed) ends the attempt ``token`` with
    ``outcome``; the run's status follows it ("lost" makes the run "failed"; a ``failure`` that is
    retried makes it "requeued"). Ending an attempt twice is refused."""
    _check(outcome, OUTCOMES, "outcome")
    if failure is not None and outcome != "failed":
        raise StateError(f"a failure is recorded with outcome 'failed', not {outcome!r}.")
    index = next((i for i, attempt in enumerate(state.attempts) if attempt.token == token), None)
    if index is None:
        raise StateError(f"no attempt with token {token!r} in state.json; begin_attempt must record it first.")
    attempt = state.attempts[index]
    if attempt.ended:
        raise StateError(f"attempt {attempt.number} already ended ({attempt.outcome}); it cannot end again.")
    ended = dataclasses.replace(attempt, ended_at=now(), outcome=outcome, signal=signal, step=step, error=error,
                                failure=failure)
    attempts = (*state.attempts[:index], ended, *state.attempts[index + 1:])
    status = _STATUS_AFTER[outcome] if index == len(state.attempts) - 1 else state.status
    if failure is not None and failure.retried and index == len(state.attempts) - 1:
        status = "requeued"  # shown as "failed (retrying)
    return _replace(state, status=status, attempts=attempts, stopping_signal=None)


def refuse_retry(state: RunState, *, token: str, reason: str) -> RunState:
    """The retry decided for the failed attempt ``token`` could not be carried out (``reason``: e.g.
    ``scontrol requeue`` refused): its failure is not retried after all, and the run is "failed"."""
    attempts = list(state.attempts)
    index = next((i for i, attempt in enumerate(attempts) if attempt.token == token), None)
    if index is None or attempts[index].failure is None:
        raise StateError(f"no failed attempt with token {token!r} in state.json.")
    attempt = attempts[index]
    attempts[index] = dataclasses.replace(
        attempt, failure=dataclasses.replace(attempt.failure, retried=False, reason=reason),
        error=f"{attempt.error}; but not retried: {reason}")
    status = "failed" if index == len(attempts) - 1 and state.status == "requeued" else state.status
    return _replace(state, status=status, attempts=tuple(attempts))


def exclude_nodes(state: RunState, *, hosts: tuple[str, ...] | list[str], attempt: int, cause: str) -> RunState:
    """Leave ``hosts`` (where a rank of attempt ``attempt`` died or hung, with ``cause``) out of the run's
    later SLURM jobs. Hosts already excluded keep their first record; no-op when nothing is new."""
    new = [host for host in dict.fromkeys(hosts) if host not in state.excluded_hosts]
    if not new:
        return state
    at = now()
    added = tuple(ExcludedNode(host=host, attempt=attempt, at=at, cause=cause) for host in new)
    return _replace(state, excluded_nodes=(*state.excluded_nodes, *added))


def lift_exclusions(state: RunState, *, attempt: int) -> RunState:
    """Allow again the hosts excluded after attempt ``attempt``: its failure repeated on another host, so it
    was the job's, not the node's. No-op when none were."""
    kept = tuple(node for node in state.excluded_nodes if node.attempt != attempt)
    return state if len(kept) == len(state.excluded_nodes) else _replace(state, excluded_nodes=kept)


def include_nodes(state: RunState) -> RunState:
    """``elfes resume --include-nodes``: every excluded host may run the run's jobs again. No-op when none is."""
    return _replace(state, excluded_nodes=()) if state.excluded_nodes else state


def include_nodes_after(state: RunState, *, token: str, why: str) -> RunState:
    """The retry of the failed attempt ``token`` leaves no node out after all (``why``: e.g. the requeued job could
    not be placed without them): every host is allowed again, and the attempt's error says why, for ``elfes
    status`` to show."""
    index = next((i for i, attempt in enumerate(state.attempts) if attempt.token == token), None)
    attempts = list(state.attempts)
    if index is not None:
        attempt = attempts[index]
        attempts[index] = dataclasses.replace(attempt, error=f"{attempt.error}; {why}" if attempt.error else why)
    return _replace(state, excluded_nodes=(), attempts=tuple(attempts))


def requeued_by_slurm(state: RunState) -> RunState:
    """The run as it is once SLURM requeued a job whose last attempt stopped on SIGTERM and waited (a
    preemption in PreemptMode=REQUEUE): that attempt "requeued", the run "requeued". One whose last
    attempt never recorded its end (its node failed) is "requeued" too; the relaunch closes that attempt
    as "lost". For ``elfes status``, which sees SLURM's restart count grow before the relaunch records
    itself; no-op otherwise."""
    attempt = state.last_attempt
    if state.status in ("running", "stopping") and attempt is not None and not attempt.ended:
        return _replace(state, status="requeued", stopping_signal=None)
    if state.status != "stopped" or attempt is None or attempt.outcome != "stopped":
        return state
    return _replace(state, status="requeued", attempts=(*state.attempts[:-1],
                                                        dataclasses.replace(attempt, outcome="requeued")))


def cancel_between_attempts(state: RunState) -> RunState:
    """``elfes cancel`` took the run's job while a requeue was under way (its last attempt ended, the
    relaunch has not begun): no attempt will record the cancel, so the run is "cancelled" here, as
    ``elfes status`` then shows it. No-op otherwise: a relaunch that began records the cancel itself."""
    attempt = state.last_attempt
    if state.status != "requeued" or attempt is None or not attempt.ended:
        return state
    return _replace(state, status="cancelled", stopping_signal=None)


def token_restart(token: str) -> int | None:
    """The restart number in an attempt's token (``"JOB:RESTART/SUBMISSIONS"``, built by
    ``launcher.job.distributed_env.Start.token``), or None for another token."""
    _, separator, rest = token.rpartition(":")
    restart = rest.partition("/")[0]
    return int(restart) if separator and restart.isdigit() else None


def mark_lost(state: RunState, *, cancelled: bool, error: str | None = None) -> RunState:
    """The job is gone (no live process, not queued) while the state says it was alive: close the
    open attempt as "lost" and end the run "cancelled" (``cancelled``: a cancel marker exists) or
    "failed". For ``elfes status``/``resume``, which see the job's liveness; no-op on an ended run."""
    if state.status in ENDED:
        return state
    message = error or "the job ended without recording an outcome (killed, or its node failed); see `elfes logs`"
    attempts = list(state.attempts)
    if attempts and not attempts[-1].ended:
        attempts[-1] = dataclasses.replace(attempts[-1], ended_at=now(), outcome="lost", error=message)
    return _replace(state, status="cancelled" if cancelled else "failed", attempts=tuple(attempts),
                    stopping_signal=None)


# -- what every rank computes the same way at a start -----------------------------------------------------------


def attempt_number(state: RunState | None, token: str) -> int:
    """The number of the attempt identified by ``token``, the same on every rank whether or not rank 0
    has recorded it yet."""
    if state is None:
        return 1
    return 1 + sum(1 for attempt in state.attempts if attempt.token != token)


def requeues_used_by(state: RunState | None, token: str, launch: str) -> int:
    """Requeues used once the start ``token`` (launched as ``launch``) is counted, on every rank alike."""
    if state is None:
        return int(launch == "requeue")
    earlier = tuple(attempt for attempt in state.attempts if attempt.token != token)
    return _relaunches(earlier) + (launch == "requeue" and not _retries(earlier))


def failures_used_by(state: RunState | None, token: str, launch: str) -> int:
    """Retried failures before the start ``token`` (launched as ``launch``) since the run was last handed over by
    hand (:attr:`RunState.failures_used`), on every rank alike: none for the first start of a submit or resume."""
    if state is None or launch != "requeue":
        return 0
    return _failures_since_hand_over(tuple(attempt for attempt in state.attempts if attempt.token != token))


def previous_attempt(state: RunState | None, token: str) -> Attempt | None:
    """The attempt before the start ``token`` (the latest other one), or None."""
    earlier = [attempt for attempt in (state.attempts if state is not None else ()) if attempt.token != token]
    return earlier[-1] if earlier else None


def latest_submission_kind(state: RunState | None) -> str:
    """How the latest submission came about ("submit", "resume", "requeue"); "submit" without one."""
    return state.submissions[-1].kind if state is not None and state.submissions else "submit"


# -- files ------------------------------------------------------------------------------------------------------


def load_state(paths: RunPaths) -> RunState | None:
    """The run's state, or None when ``state.json`` does not exist yet. Any process; takes no lock.
    A file that cannot be read raises :class:`StateError`: the file, what is wrong, a safe repair. So does a
    ``state.json`` that is not a regular file (a dangling symbolic link, a folder, a pipe): it is not a run
    that never started."""
    try:
        info = paths.state.stat()
    except FileNotFoundError:
        if not paths.state.is_symlink():
            return None
        raise StateError(f"{paths.state} cannot be read: it is a symbolic link to {os.readlink(paths.state)}, which "
                         f"does not exist (elfes writes state.json as a regular file). {_repair(paths)}") from None
    except OSError as error:
        raise StateError(f"{paths.state} cannot be read ({error.strerror or error}); check it and its permissions") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise StateError(f"{paths.state} cannot be read: it is {kind} (elfes writes state.json as a regular file). "
                         f"{_repair(paths)}")
    try:
        content = paths.state.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise StateError(f"{paths.state} cannot be read ({error.strerror or error}); check it and its permissions") from None
    try:
        return RunState.from_json(json.loads(content.decode("utf-8")))
    except StateError as error:
        raise StateError(f"{paths.state} {error}") from None
    except ValueError as error:  # not UTF-8, not JSON, or a field that does not fit (FieldError)
        raise StateError(
            f"{paths.state} cannot be read: {error}. It is written atomically, so it was edited or damaged outside "
            f"elfes. {_repair(paths)}") from None


def _repair(paths: RunPaths) -> str:
    """The safe repair of a damaged ``state.json``: moved aside, the run handed over again; a sweep member's by
    the sweep (its job.yaml submitted alone would run outside the sweep's scheduling and ``max_parallel``)."""
    sweep = SweepPaths(paths.run_dir.parent)
    again = (f"resume the sweep (elfes resume {sweep.sweep_dir}), which hands this member over again"
             if sweep.record.is_file() else f"submit again (elfes submit {paths.spec})")
    return ("Keep the run directory (its checkpoints are intact): once no job of the run is running, move the file "
            f"aside (mv {paths.state} {paths.state}.damaged) and {again}; the run continues from checkpoints/last, its "
            "attempt history started anew.")


def save_state(paths: RunPaths, state: RunState) -> None:
    """Publish ``state`` atomically. Prefer :func:`update_state`, which also serialises writers."""
    write_text_atomically(paths.state, json.dumps(state.to_json(), indent=2) + "\n")


@contextmanager
def _locked(paths: RunPaths) -> Iterator[None]:
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(paths.state_lock):
        yield


def update_state(paths: RunPaths, change: Callable[[RunState | None], RunState]) -> RunState:
    """Load, apply ``change`` (a transition) and save, holding the run's state lock. Returns the new state.

    Submitter and rank 0 only. Nothing is written when ``change`` raises or returns the state unchanged.
    """
    with _locked(paths):
        before = load_state(paths)
        after = change(before)
        if after is not before:
            save_state(paths, after)
        return after
