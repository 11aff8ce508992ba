"""The failure path of one task's attempt (:class:`FailurePath`), once launcher/job/failures.py has said what a
failure means.

Every rank that fails publishes its report (:func:`publish_failure`). The first rank to fail ends the attempt
"failed" in ``state.json`` with the attempt's cause and decides whether it is retried; it records the nodes
the failure leaves out with it (:func:`with_exclusions`), then carries the decision out: a retry
(:func:`carry_out_retry`: SLURM ``scontrol requeue`` leaving those nodes out; local, past submitit's start
limit, a resubmission), or, for a failure not retried of a multi-task SLURM job, ``scancel``
(:func:`end_unretried_job`), so that no healthy rank waits on for the failed one until the time
limit. The other ranks read that decision. The run's backend (launcher/backends/) runs the SLURM commands.
Torch-free.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..backends import Executor, backend_for
from ..rundir import state as run_state
from ..rundir.command_group import process_stat
from ..rundir.paths import RunPaths
from ..rundir.state import Attempt, Failure, FailureCategory
from ..rundir.task_files import task_exit_status
from ..slurm import partition_nodes
from ..spec import JobSpec
from ..submit.placement import placement_problem
from .attempt_context import AttemptContext
from .distributed_env import Start
from .failures import (
    FailureReport,
    await_first_hand,
    cause_of,
    decide_failure,
    failed_nodes,
    failure_error,
    rank_records,
    read_reports,
    repeats,
    the_rank_that_failed,
    write_report,
)
from .requeue import resubmit
from .tracker_publishing import publish_lifecycle

# How long a rank that saw its peer vanish waits for the other ranks' reports before it decides: the ranks
# that stay silent are the lost ones, whose hosts a SLURM run leaves out of its later attempts.
LOST_PEER_GRACE_S = 5.0
# How long the deciding rank waits for a local controller to record how a silent rank's task ended: it polls
# its tasks 24 times a second, so the record follows the exit within tens of milliseconds; the bound only
# matters where the controller itself is gone (then the cause says less).
EXIT_STATUS_WAIT_S = 3.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HandledFailure:
    """What became of this rank's failure: the attempt's failure as decided (None where ``state.json`` could not
    take it) and whether this rank decided it (and carried it out)."""

    failure: Failure | None
    decided_here: bool

    @property
    def retried(self) -> bool:
        return self.failure is not None and self.failure.retried


class FailurePath:
    """One task's failure path for its attempt: :meth:`report` says what a failure is, :meth:`handle` records
    it and, on the deciding rank, carries the decision out. Called from the main thread or from the hang
    watchdog's, one at a time.

    ``task`` is the job's ``JobRuntime`` (resubmitted by a local retry past submitit's start limit).
    """

    def __init__(self, context: AttemptContext, *, task: Any) -> None:
        self.context = context
        self.task = task
        self._one_at_a_time = threading.Lock()  # the main thread's failure or the watchdog's, never both at once
        # What a report needs that the attempt learns on the way, each set once where it is learned:
        self.heartbeat: Any = None  # the engine's Heartbeat of an entrypoint job (its StopRequest's)
        self.final_reason: str | None = None  # why a failure now could not pass on a retry

    def report(self, error: BaseException) -> FailureReport:
        """This rank's report of ``error``: a command's failed exit, or an exception (a peer's loss when a
        collective says so), at the step the heartbeat shows."""
        context, heartbeat = self.context, self.heartbeat
        report = FailureReport.of_exception(
            error, rank=context.start.rank, host=context.start.host, at=time.time(),
            step=heartbeat.failing_step() if heartbeat is not None else None,
            updated=heartbeat is not None and heartbeat.updates > 0)
        if self.final_reason is not None:
            report = dataclasses.replace(report, final=self.final_reason)
        elif isinstance(error, KeyboardInterrupt):  # a second SIGINT asked for no save
            report = dataclasses.replace(report, final="interrupted on purpose (a second SIGINT), not a failure")
        spec = context.spec
        if spec is not None and spec.command and isinstance(error, RuntimeError) and not report.peer_lost:
            report = dataclasses.replace(report, category=FailureCategory.EXIT)
        return report

    def handle(self, report: FailureReport) -> HandledFailure:
        """Publish this rank's failure; the first rank to fail ends the attempt "failed" with the attempt's cause
        and decides whether it is retried (launcher/job/failures.py), then carries that out (a retry, or the
        end of a multi-task SLURM job); the others read the decision."""
        context = self.context
        with self._one_at_a_time:
            publish_failure(context.paths, context.attempt_number, report, world_size=context.start.world_size)
            ending = _FailedEnding(context, _attempt_cause(context, report))
            try:
                run_state.update_state(context.paths, ending)
            except Exception as error:  # never lose the failure itself to a failure to record it
                log.error(f"elfes: the failure could not be recorded in state.json ({type(error).__name__}: {error})")
                return HandledFailure(None, decided_here=ending.decided_here)
            failure = ending.failure
            if ending.decided_here and failure is not None:
                if failure.retried:
                    failure = carry_out_retry(failure, context=context, task=self.task)
                # A failure not retried ends the run: the trackers hear of it now, before the job's scancel.
                publish_lifecycle(context.paths, context.spec, send=True)
                end_unretried_job(failure, context.start)
            log.info(f"elfes: attempt {context.attempt_number} ended failed on rank {context.start.rank}"
                     + ("; retried from `last`" if failure is not None and failure.retried else
                        f"; not retried ({failure.reason})" if failure is not None and failure.reason else ""))
            return HandledFailure(failure, decided_here=ending.decided_here)


class _FailedEnding:
    """The change to ``state.json`` (made under its lock) that ends the attempt "failed", and what it found:
    :attr:`failure`, the attempt's failure as decided, by this rank (:attr:`decided_here`) or by the rank that
    failed first."""

    def __init__(self, context: AttemptContext, cause: _Cause) -> None:
        self.context, self.cause = context, cause
        self.failure: Failure | None = None
        self.decided_here = False

    def __call__(self, state: run_state.RunState | None) -> run_state.RunState:
        context = self.context
        state = context.begin(state)  # a no-op once rank 0 recorded the start (the usual case)
        attempt = next(a for a in state.attempts if a.token == context.token)
        if attempt.ended:
            self.failure = attempt.failure
            return state
        number = context.attempt_number
        cause, reports, hosts = self.cause
        failure = decide_failure(cause, previous=context.previous, failures_used=context.failures_used,
                                 max_failures=context.max_failures)
        failure = dataclasses.replace(failure, nodes=failed_nodes(cause, reports, hosts=tuple(context.start.hosts),
                                                                  ranks=hosts))
        self.failure, self.decided_here = failure, True
        state = run_state.end_attempt(state, token=context.token, outcome=run_state.Outcome.FAILED,
                                      error=failure_error(failure, cause), failure=failure)
        return with_exclusions(state, failure, attempt=number, previous=context.previous,
                               excluding=excludes_nodes(context.executor, context.spec), final=cause.final is not None)


class _Cause(NamedTuple):
    """What the failure reports and pid records of an attempt say: its cause, every rank's report, each rank's host."""

    cause: FailureReport
    reports: list[FailureReport]
    hosts: dict[int, str]


def _attempt_cause(context: AttemptContext, report: FailureReport) -> _Cause:
    """The attempt's cause as the failure reports and pid records say (launcher/job/failures.py), with every rank's
    report and host. Worked out before the state lock: it may wait for a silent rank's exit status."""
    paths, number, start = context.paths, context.attempt_number, context.start
    reports = read_reports(paths, number) or [report]
    records = rank_records(paths, number)
    hosts = {rank: record["host"] for rank, record in records.items()}
    cause = the_rank_that_failed(cause_of(reports), reports, world_size=start.world_size, hosts=hosts,
                                 gone=lambda rank: _task_gone(records.get(rank), host=start.host),
                                 exit_status=lambda rank: awaited_exit_status(paths, start, records.get(rank)))
    return _Cause(cause, reports, hosts)


def _local_pid(record: dict[str, Any] | None, host: str) -> int | None:
    """The pid of a pid record (``RunPaths.pid_file``) of a task on ``host`` (this task's), else None."""
    if record is None or record.get("host") != host or not isinstance(record.get("pid"), int):
        return None
    return int(record["pid"])


def _task_gone(record: dict[str, Any] | None, *, host: str) -> bool:
    """Whether the task of a pid record is known to have ended (a zombie too): one on ``host`` only."""
    pid = _local_pid(record, host)
    if pid is None:
        return False
    process = process_stat(pid)
    return process is None or not process.live


def publish_failure(paths: RunPaths, attempt: int, report: FailureReport, *, world_size: int) -> None:
    """Say in the log that this rank failed and write its report (``RunPaths.failure_report``; a write that fails
    only warns). A rank that lost a peer in a multi-rank attempt then waits up to :data:`LOST_PEER_GRACE_S` for
    the other ranks' reports. Every failing rank, before the decision."""
    log.error(f"elfes: attempt {attempt} failed on rank {report.rank}: {report.cause}")
    try:
        write_report(paths, attempt, report)
    except OSError as error:
        log.warning(f"elfes: the failure report could not be written ({error})")
    if report.category == FailureCategory.LOST and world_size > 1:
        await_first_hand(paths, attempt, world_size, LOST_PEER_GRACE_S)


def awaited_exit_status(paths: RunPaths, start: Start, record: dict[str, Any] | None) -> int | None:
    """How the task of pid record ``record`` (``RunPaths.pid_file``) ended, as its local job's controller recorded
    it: its exit code, or minus the signal that killed it. Waits up to :data:`EXIT_STATUS_WAIT_S` while the task has
    exited but is not recorded yet. None on SLURM (srun is the tasks' parent), for a task on another host or still
    running, or when nothing was recorded in time."""
    pid = _local_pid(record, start.host)
    here = backend_for(start.executor).runs_here
    if not here or pid is None or record is None or not isinstance(record.get("rank"), int):
        return None
    deadline = time.monotonic() + EXIT_STATUS_WAIT_S
    while True:
        returncode = task_exit_status(paths, record["rank"], job_id=start.job_id, pid=pid)
        if returncode is not None:
            return returncode
        process = process_stat(pid)
        if (process is not None and process.live) or time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def excludes_nodes(executor: Executor, spec: JobSpec | None) -> bool:
    """Whether the run leaves the nodes of its failures out (SLURM, ``requeue.exclude_failed_nodes``); ``spec`` is
    None for an attempt that failed before reading it."""
    return spec is not None and backend_for(executor).excludes_failed_nodes(spec)


def with_exclusions(state: run_state.RunState, failure: Failure, *, attempt: int, previous: Attempt | None,
                    excluding: bool, final: bool) -> run_state.RunState:
    """``state`` with the nodes of ``failure`` (attempt number ``attempt``) excluded, when the run is ``excluding``
    them and the failure is not ``final`` (it would fail anywhere). A failure that repeats the ``previous``
    attempt's was the job's, not a node's: the nodes excluded after that one are allowed again."""
    if not excluding:
        return state
    if repeats(failure, previous) and previous is not None:
        return run_state.lift_exclusions(state, attempt=previous.number)
    if final or not failure.nodes:
        return state
    return run_state.exclude_nodes(state, hosts=failure.nodes, attempt=attempt, cause=failure.cause)


def carry_out_retry(failure: Failure, *, context: AttemptContext, task: Any) -> Failure:
    """The deciding rank's part of a retry: a backend that requeues from inside (SLURM's ``scontrol requeue``)
    does so leaving the excluded nodes out (refused, or the job could not be placed: the run ends failed, saying
    why); one past its controller's start limit resubmits ``task`` (the job's ``JobRuntime``). Returns the
    failure as it stands."""
    paths, start, token, spec = context.paths, context.start, context.token, context.spec
    backend = backend_for(start.executor)
    refused = None
    if backend.requeues_from_inside and spec is None:  # unreadable: such an attempt is never retried (attempt_context)
        refused = f"{paths.spec} could not be read, so the requeue's node exclusions cannot be decided"
    elif backend.requeues_from_inside and spec is not None:
        state = run_state.load_state(paths)
        excluded = state.excluded_hosts if state is not None and excludes_nodes(start.executor, spec) else ()
        refused = _requeue_leaving_out(start, excluded, paths=paths, spec=spec, token=token)
    elif backend.resubmits(start.restart):
        try:
            resubmit(paths, task, start.executor)
        except Exception as error:  # recorded by resubmit
            refused = f"the local resubmission failed: {error}"
    if refused is None:
        return failure
    run_state.update_recorded_state(paths, lambda s: run_state.refuse_retry(s, token=token, reason=refused))
    return dataclasses.replace(failure, retried=False, reason=refused)


def _requeue_leaving_out(start: Start, excluded: tuple[str, ...], *, paths: RunPaths, spec: JobSpec,
                         token: str) -> str | None:
    """The backend's requeue, then the requeued job's excluded nodes (``ExcNodeList``) when the run excludes
    nodes. Where the exclusions would leave the partition too few nodes for the job
    (launcher/submit/placement.py), SLURM would hold it pending for good: nothing is left out then, the job is
    requeued onto every node, and the log and the failed attempt's error (``elfes status``) say so. None, or
    why it did not requeue."""
    if excluded:
        partition = os.environ.get("SLURM_JOB_PARTITION") or spec.slurm.partition
        nodes = partition_nodes(partition)
        problem = nodes and placement_problem(needed=spec.resources.nodes, partition=partition, nodes=nodes,
                                              excluded=excluded)
        if problem:
            run_state.update_recorded_state(paths, lambda s: run_state.include_nodes_after(s, token=token, why=problem))
            log.info(f"elfes: {problem}")
            excluded = ()
    backend = backend_for(start.executor)
    refused = backend.requeue(start.job_id)
    if refused is None and excluded:
        backend.exclude(start.job_id, excluded)
    return refused


def end_unretried_job(failure: Failure, start: Start) -> None:
    """The deciding rank's end of a failure not retried: its backend ends the job's other tasks now (a
    multi-task SLURM job is ``scancel``ed; a local controller ends them itself). For a retried failure, nothing."""
    if not failure.retried:
        # The healthy ranks may never see this one go (a rendezvous, a long collective): end them all now.
        backend_for(start.executor).end_unretried(start.job_id, start.world_size)
