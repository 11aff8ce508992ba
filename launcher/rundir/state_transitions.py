"""The state machine of ``state.json``: pure transitions ``RunState -> RunState``, and what every rank computes
the same way at a start. Torch-free.

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

A transition returns a new object and refuses an impossible move with :class:`~launcher.errors.NotNow`, so the
submitter and the job share them (through launcher/rundir/state.py's ``update_state``):

>>> update_state(paths, lambda s: record_submission(s, executor="local", kind="submit", max_requeues=20))  # doctest: +SKIP
>>> update_state(paths, lambda s: mark_pending(s, job_id="4242"))  # doctest: +SKIP

``excluded_nodes`` are changed by :func:`exclude_nodes` (by the rank that decided the failure) and
:func:`include_nodes` (by ``elfes resume --include-nodes``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..backends import Executor, backend_for
from ..errors import NotNow
from .provenance import Provenance, RankPlace
from .state_records import (
    ENDED,
    LAUNCHES,
    OUTCOMES,
    STATUS_AFTER,
    Attempt,
    ExcludedNode,
    Failure,
    Launch,
    Outcome,
    RunState,
    RunStatus,
    Submission,
    failures_since_hand_over,
    now,
    relaunches,
    retries_failure,
)


def _replace(state: RunState, **changes: Any) -> RunState:
    return dataclasses.replace(state, updated_at=now(), **changes)


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise NotNow(f"{what} must be one of {', '.join(allowed)}; got {value!r}.")


# -- transitions (pure) ---------------------------------------------------------------------------------------


def record_submission(state: RunState | None, *, executor: Executor, kind: str, max_requeues: int,
                      job_id: str | None = None, host: str | None = None, pid: int | None = None,
                      submitit_folder: str | None = None, array_task: int | None = None,
                      refuse_finished: str | None = None, run_dir: str) -> RunState:
    """The submitter (``host``, ``pid``) hands the run to ``executor``: "submitted" ("pending" with ``job_id``).
    ``kind``: "submit", "resume", or "requeue" (a local job's rank 0 past submitit's start limit).
    Refused unless the run ended (:data:`ENDED`), or for "requeue" is requeued; a "submitted" run (a hand-over
    that never recorded its job) is settled first: :func:`mark_pending` or :func:`mark_submission_abandoned`.
    With ``refuse_finished``, a finished run is refused with that message; ``run_dir`` names the run in a refusal
    (the command it suggests)."""
    _check(kind, LAUNCHES, "the submission kind")
    kind = Launch(kind)
    chosen = backend_for(executor).executor  # ExecutorError for a name that is no backend's
    if max_requeues < 0:
        raise NotNow(f"max_requeues must be >= 0; got {max_requeues}.")
    submission = Submission(at=now(), executor=chosen, kind=kind, job_id=job_id, host=host, pid=pid,
                            submitit_folder=submitit_folder, array_task=array_task)
    status = RunStatus.SUBMITTED if job_id is None else RunStatus.PENDING
    if state is None:
        if kind != Launch.SUBMIT:
            raise NotNow(f"a {kind} needs an existing run; this run directory has no state.json yet (use elfes submit).")
        return RunState(status=status, executor=chosen, max_requeues=max_requeues, job_id=job_id,
                        submissions=(submission,))
    if refuse_finished is not None and state.status == RunStatus.FINISHED:
        raise NotNow(refuse_finished)  # decided here, under the state lock: the job may have just finished
    allowed = {Launch.SUBMIT: ENDED, Launch.RESUME: ENDED, Launch.REQUEUE: {RunStatus.REQUEUED}}[kind]
    if state.status not in allowed:
        retried = _retried_failure(state) if kind == Launch.RESUME else None
        if retried is not None:
            number, failure = retried
            raise NotNow(
                f"the run is retrying itself from `last` after attempt {number} failed ({failure.cause}); it needs "
                f"no resume while it does: follow it with `elfes status {run_dir} --until ended`, and resume it only "
                "once it has ended stopped, cancelled, failed or finished.")
        raise NotNow(
            f"cannot record a {kind} while the run is {state.status}"
            + (f" (job {state.job_id})" if state.job_id else "")
            + ("; an earlier submission has not recorded its job: settle it first." if state.status == RunStatus.SUBMITTED else
               {Launch.SUBMIT: "; wait for it to end or `elfes cancel` it first.",
                Launch.RESUME: "; only a stopped, cancelled, failed or finished run can be resumed.",
                Launch.REQUEUE: "; only a requeued run is resubmitted."}[kind]))
    return _replace(state, status=status, executor=chosen, max_requeues=max_requeues, job_id=job_id,
                    submissions=(*state.submissions, submission), stopping_signal=None)


def _retried_failure(state: RunState) -> tuple[int, Failure] | None:
    """The number and failure of the failed attempt whose retry the run is waiting for (requeued) or running, if it
    is retrying one."""
    ended = [attempt for attempt in state.attempts if attempt.ended]
    retrying = state.status in (RunStatus.REQUEUED, RunStatus.PENDING, RunStatus.RUNNING, RunStatus.STOPPING)
    if not (retrying and retries_failure(tuple(ended))):
        return None
    failure = ended[-1].failure
    assert failure is not None  # retries_failure: the latest ended attempt failed
    return ended[-1].number, failure


def mark_submission_abandoned(state: RunState, *, error: str) -> RunState:
    """The latest submission was cut short before it recorded a job, and none exists: it keeps ``error``
    and the run is "failed", so a new submission may follow. No-op unless the run is "submitted"."""
    if state.status != RunStatus.SUBMITTED or not state.submissions:
        return state
    submissions = (*state.submissions[:-1], dataclasses.replace(state.submissions[-1], error=error))
    return _replace(state, status=RunStatus.FAILED, job_id=None, submissions=submissions)


def mark_pending(state: RunState, *, job_id: str) -> RunState:
    """The executor accepted the latest submission as ``job_id``. A job that already started keeps its status."""
    if not state.submissions:
        raise NotNow("mark_pending needs a recorded submission; call record_submission first.")
    latest = dataclasses.replace(state.submissions[-1], job_id=str(job_id))
    status = RunStatus.PENDING if state.status == RunStatus.SUBMITTED else state.status
    return _replace(state, status=status, job_id=str(job_id), submissions=(*state.submissions[:-1], latest))


def mark_submission_failed(state: RunState, *, error: str) -> RunState:
    """The executor refused the latest submission (e.g. sbatch failed): the run is failed with ``error``."""
    attempt = Attempt(number=len(state.attempts) + 1, token="submission", job_id=state.job_id or "",
                      launch=state.submissions[-1].kind if state.submissions else Launch.SUBMIT,
                      started_at=now(), ended_at=now(), outcome=Outcome.FAILED, error=error)
    return _replace(state, status=RunStatus.FAILED, attempts=(*state.attempts, attempt))


def begin_attempt(
    state: RunState, *, token: str, job_id: str, launch: str, hosts: tuple[str, ...] | list[str], world_size: int
) -> RunState:
    """Rank 0 started attempt ``len(attempts_without(token)) + 1``: status "running".

    A previous attempt that never recorded its end is closed as "lost" first; one of the same job that
    stopped (SIGTERM: it saved and waited) before this requeue launch was requeued by SLURM, and says so.
    Recording the same ``token`` again is a no-op (idempotent).
    """
    _check(launch, LAUNCHES, "launch")
    launch = Launch(launch)
    if any(attempt.token == token for attempt in state.attempts):
        return state
    attempts = list(state.attempts)
    if attempts and not attempts[-1].ended:
        attempts[-1] = dataclasses.replace(
            attempts[-1], ended_at=now(), outcome=Outcome.LOST,
            error=attempts[-1].error or "the attempt ended without recording an outcome (killed, or its node failed)",
        )
    elif attempts and launch == Launch.REQUEUE and attempts[-1].outcome == Outcome.STOPPED and attempts[-1].job_id == str(job_id):
        # It stopped on SIGTERM and waited; SLURM requeued the same job (a preemption in PreemptMode=REQUEUE).
        attempts[-1] = dataclasses.replace(attempts[-1], outcome=Outcome.REQUEUED)
    attempt = Attempt(number=len(attempts) + 1, token=token, job_id=str(job_id), launch=launch, started_at=now(),
                      hosts=tuple(hosts), world_size=world_size)
    return _replace(state, status=RunStatus.RUNNING, job_id=str(job_id), attempts=(*attempts, attempt), stopping_signal=None)


def record_provenance(state: RunState, *, token: str, provenance: Provenance) -> RunState:
    """Rank 0 records what the attempt ``token`` runs on (its code and environment). No-op for an unknown token."""
    index = next((i for i, attempt in enumerate(state.attempts) if attempt.token == token), None)
    if index is None:
        return state
    attempt = dataclasses.replace(state.attempts[index], provenance=provenance)
    return _replace(state, attempts=(*state.attempts[:index], attempt, *state.attempts[index + 1:]))


def record_rank_place(state: RunState, *, token: str, place: RankPlace) -> RunState:
    """Each rank records where it computes in the attempt ``token`` (again: replaced). No-op for an unknown token:
    a rank records once it has read rank 0's rendezvous port, which rank 0 publishes after beginning the attempt."""
    index = next((i for i, attempt in enumerate(state.attempts) if attempt.token == token), None)
    if index is None:
        return state
    places = sorted((*(p for p in state.attempts[index].rank_places if p.rank != place.rank), place), key=lambda p: p.rank)
    attempt = dataclasses.replace(state.attempts[index], rank_places=tuple(places))
    return _replace(state, attempts=(*state.attempts[:index], attempt, *state.attempts[index + 1:]))


def mark_stopping(state: RunState, *, signal: str | None) -> RunState:
    """A stop was requested (``signal``, e.g. "SIGUSR2"); the job is saving ``last``. Only from "running"."""
    if state.status != RunStatus.RUNNING:
        return state
    return _replace(state, status=RunStatus.STOPPING, stopping_signal=signal)


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
    outcome = Outcome(outcome)
    if failure is not None and outcome != Outcome.FAILED:
        raise NotNow(f"a failure is recorded with outcome 'failed', not {outcome!r}.")
    index = next((i for i, attempt in enumerate(state.attempts) if attempt.token == token), None)
    if index is None:
        raise NotNow(f"no attempt with token {token!r} in state.json; begin_attempt must record it first.")
    attempt = state.attempts[index]
    if attempt.ended:
        raise NotNow(f"attempt {attempt.number} already ended ({attempt.outcome}); it cannot end again.")
    ended = dataclasses.replace(attempt, ended_at=now(), outcome=outcome, signal=signal, step=step, error=error,
                                failure=failure)
    attempts = (*state.attempts[:index], ended, *state.attempts[index + 1:])
    status = STATUS_AFTER[outcome] if index == len(state.attempts) - 1 else state.status
    if failure is not None and failure.retried and index == len(state.attempts) - 1:
        status = RunStatus.REQUEUED  # shown as "failed (retrying)
    return _replace(state, status=status, attempts=attempts, stopping_signal=None)


def refuse_retry(state: RunState, *, token: str, reason: str) -> RunState:
    """The retry decided for the failed attempt ``token`` could not be carried out (``reason``: e.g.
    ``scontrol requeue`` refused): its failure is not retried after all, and the run is "failed"."""
    attempts = list(state.attempts)
    index = next((i for i, attempt in enumerate(attempts) if attempt.token == token), None)
    failure = attempts[index].failure if index is not None else None
    if index is None or failure is None:
        raise NotNow(f"no failed attempt with token {token!r} in state.json.")
    attempt = attempts[index]
    attempts[index] = dataclasses.replace(
        attempt, failure=dataclasses.replace(failure, retried=False, reason=reason),
        error=f"{attempt.error}; but not retried: {reason}")
    status = RunStatus.FAILED if index == len(attempts) - 1 and state.status == RunStatus.REQUEUED else state.status
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
    if state.status in (RunStatus.RUNNING, RunStatus.STOPPING) and attempt is not None and not attempt.ended:
        return _replace(state, status=RunStatus.REQUEUED, stopping_signal=None)
    if state.status != RunStatus.STOPPED or attempt is None or attempt.outcome != Outcome.STOPPED:
        return state
    return _replace(state, status=RunStatus.REQUEUED, attempts=(
        *state.attempts[:-1], dataclasses.replace(attempt, outcome=Outcome.REQUEUED)))


def cancel_between_attempts(state: RunState) -> RunState:
    """``elfes cancel`` took the run's job while a requeue was under way (its last attempt ended, the
    relaunch has not begun): no attempt will record the cancel, so the run is "cancelled" here, as
    ``elfes status`` then shows it. No-op otherwise: a relaunch that began records the cancel itself."""
    attempt = state.last_attempt
    if state.status != RunStatus.REQUEUED or attempt is None or not attempt.ended:
        return state
    return _replace(state, status=RunStatus.CANCELLED, stopping_signal=None)


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
        attempts[-1] = dataclasses.replace(attempts[-1], ended_at=now(), outcome=Outcome.LOST, error=message)
    return _replace(state, status=RunStatus.CANCELLED if cancelled else RunStatus.FAILED, attempts=tuple(attempts),
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
        return int(launch == Launch.REQUEUE)
    earlier = tuple(attempt for attempt in state.attempts if attempt.token != token)
    return relaunches(earlier) + (launch == Launch.REQUEUE and not retries_failure(earlier))


def failures_used_by(state: RunState | None, token: str, launch: str) -> int:
    """Retried failures before the start ``token`` (launched as ``launch``) since the run was last handed over by
    hand (:attr:`RunState.failures_used`), on every rank alike: none for the first start of a submit or resume."""
    if state is None or launch != Launch.REQUEUE:
        return 0
    return failures_since_hand_over(tuple(attempt for attempt in state.attempts if attempt.token != token))


def previous_attempt(state: RunState | None, token: str) -> Attempt | None:
    """The attempt before the start ``token`` (the latest other one), or None."""
    earlier = [attempt for attempt in (state.attempts if state is not None else ()) if attempt.token != token]
    return earlier[-1] if earlier else None


def latest_submission_kind(state: RunState | None) -> Launch:
    """How the latest submission came about ("submit", "resume", "requeue"); "submit" without one."""
    return state.submissions[-1].kind if state is not None and state.submissions else Launch.SUBMIT
