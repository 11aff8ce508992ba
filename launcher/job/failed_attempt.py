"""Acting on a failed attempt inside the job, once launcher/job/failures.py has said what the failure means.

Every rank that fails publishes its report (:func:`publish_failure`). The rank that ends the attempt
"failed" (launcher/job/runtime.py decides which, and records the decision in ``state.json``) records the
nodes the failure leaves out with it (:func:`with_exclusions`), then carries the decision out: a retry
(:func:`carry_out_retry`: SLURM ``scontrol requeue`` leaving those nodes out; local, past submitit's start
limit, a resubmission), or, for a failure not retried of a multi-task SLURM job, ``scancel``
(:func:`end_unretried_slurm_job`), so that no healthy rank waits on for the failed one until the time
limit. launcher/job/requeue.py runs the SLURM and local commands. Torch-free.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

from ..rundir import state as run_state
from ..rundir.command_group import process_stat
from ..rundir.paths import RunPaths
from ..rundir.state import Attempt, Failure
from ..rundir.task_files import task_exit_status
from ..slurm import partition_nodes
from ..spec import JobSpec
from ..submit.placement import placement_problem
from .distributed_env import Start
from .failures import FailureReport, await_first_hand, repeats, write_report
from .requeue import LOCAL_MAX_STARTS, end_failed_slurm_job, exclude_from_slurm_job, requeue_slurm_job, resubmit_local

# How long a rank that saw its peer vanish waits for the other ranks' reports before it decides: the ranks
# that stay silent are the lost ones, whose hosts a SLURM run leaves out of its later attempts.
LOST_PEER_GRACE_S = 5.0
# How long the deciding rank waits for a local controller to record how a silent rank's task ended: it polls
# its tasks 24 times a second, so the record follows the exit within tens of milliseconds; the bound only
# matters where the controller itself is gone (then the cause says less).
EXIT_STATUS_WAIT_S = 3.0


def publish_failure(paths: RunPaths, attempt: int, report: FailureReport, *, world_size: int) -> None:
    """Say in the log that this rank failed and write its report (``RunPaths.failure_report``; a write that fails
    only warns). A rank that lost a peer in a multi-rank attempt then waits up to :data:`LOST_PEER_GRACE_S` for
    the other ranks' reports. Every failing rank, before the decision."""
    print(f"elfes: attempt {attempt} failed on rank {report.rank}: {report.cause}", file=sys.stderr, flush=True)
    try:
        write_report(paths, attempt, report)
    except OSError as error:
        print(f"elfes: the failure report could not be written ({error})", file=sys.stderr, flush=True)
    if report.category == "lost" and world_size > 1:
        await_first_hand(paths, attempt, world_size, LOST_PEER_GRACE_S)


def awaited_exit_status(paths: RunPaths, start: Start, record: dict[str, Any] | None) -> int | None:
    """How the task of pid record ``record`` (``RunPaths.pid_file``) ended, as its local job's controller recorded
    it: its exit code, or minus the signal that killed it. Waits up to :data:`EXIT_STATUS_WAIT_S` while the task has
    exited but is not recorded yet. None on SLURM (srun is the tasks' parent), for a task on another host or still
    running, or when nothing was recorded in time."""
    if start.executor != "local" or record is None or record.get("host") != start.host \
            or not isinstance(record.get("pid"), int) or not isinstance(record.get("rank"), int):
        return None
    deadline = time.monotonic() + EXIT_STATUS_WAIT_S
    while True:
        returncode = task_exit_status(paths, record["rank"], job_id=start.job_id, pid=record["pid"])
        if returncode is not None:
            return returncode
        process = process_stat(record["pid"])
        if (process is not None and process.live) or time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def excludes_nodes(executor: str, spec: JobSpec | None) -> bool:
    """Whether the run leaves the nodes of its failures out (SLURM, ``requeue.exclude_failed_nodes``); ``spec`` is
    None for an attempt that failed before reading it."""
    return executor == "slurm" and spec is not None and spec.requeue.exclude_failed_nodes


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


def carry_out_retry(failure: Failure, *, paths: RunPaths, start: Start, token: str, spec: JobSpec,
                    task: Any) -> Failure:
    """The deciding rank's part of a retry: SLURM ``scontrol requeue`` leaving the excluded nodes out (refused, or
    the job could not be placed: the run ends failed, saying why); local past submitit's start limit, a
    resubmission of ``task`` (the job's ``JobRuntime``). Returns the failure as it stands."""
    refused = None
    if start.executor == "slurm":
        state = run_state.load_state(paths)
        excluded = state.excluded_hosts if state is not None and excludes_nodes(start.executor, spec) else ()
        refused = _requeue_leaving_out(start.job_id, excluded, paths=paths, spec=spec, token=token)
    elif start.restart + 1 >= LOCAL_MAX_STARTS:
        try:
            resubmit_local(paths, task)
        except Exception as error:  # recorded by resubmit_local
            refused = f"the local resubmission failed: {error}"
    if refused is None:
        return failure
    run_state.update_state(paths, lambda s: run_state.refuse_retry(s, token=token, reason=refused))
    return dataclasses.replace(failure, retried=False, reason=refused)


def _requeue_leaving_out(job_id: str, excluded: tuple[str, ...], *, paths: RunPaths, spec: JobSpec,
                         token: str) -> str | None:
    """``scontrol requeue``, then ``ExcNodeList`` of the requeued job when the run excludes nodes. Where the
    exclusions would leave the partition too few nodes for the job (launcher/submit/placement.py), SLURM
    would hold it pending for good: nothing is left out then, the job is requeued onto every node, and the
    log and the failed attempt's error (``elfes status``) say so. None, or why it did not requeue."""
    if excluded:
        partition = os.environ.get("SLURM_JOB_PARTITION") or spec.slurm.partition
        nodes = partition_nodes(partition)
        problem = nodes and placement_problem(needed=spec.resources.nodes, partition=partition, nodes=nodes,
                                              excluded=excluded)
        if problem:
            run_state.update_state(paths, lambda s: run_state.include_nodes_after(s, token=token, why=problem))
            print(f"elfes: {problem}", flush=True)
            excluded = ()
    refused = requeue_slurm_job(job_id)
    if refused is None and excluded:
        exclude_from_slurm_job(job_id, excluded)
    return refused


def end_unretried_slurm_job(failure: Failure, start: Start) -> None:
    """The deciding rank's end of a failure not retried, in a multi-task SLURM job: ``scancel`` it now
    (launcher/job/requeue.py). Elsewhere, or for a retried failure, nothing."""
    if not failure.retried and start.executor == "slurm" and start.world_size > 1:
        # The healthy ranks may never see this one go (a rendezvous, a long collective): end them all now.
        end_failed_slurm_job(start.job_id)
