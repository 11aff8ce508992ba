"""Carrying out an attempt's decision on its executor: a SLURM job requeues itself with
``scontrol requeue``; a local job exits for submitit's controller to relaunch it (or, past the
controller's six starts, rank 0 resubmits the run); a cancelled SLURM job ``scancel``s itself, so that
no requeue brings it back, and so does one whose failure is not retried, so that no task waits on; a
SLURM job that stopped on SIGTERM waits for SLURM to end it. Inside the job; torch-free.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..rundir.paths import RunPaths
from ..slurm import cancel, exclude_nodes, requeue
from ..submit.transaction import resubmit_run

# submitit's local controller relaunches all tasks when any exits with this code
# (submitit.local.local.LOCAL_REQUEUE_RETURN_CODE).
LOCAL_REQUEUE_EXIT_CODE = 144
# submitit's local controller starts a job at most this often (Controller.run(max_retry=6)); a local
# requeue past that is a resubmission into the same run directory.
LOCAL_MAX_STARTS = 6

log = logging.getLogger(__name__)


def requeue_slurm_job(job_id: str) -> str | None:
    """``scontrol requeue JOB_ID`` from inside the job (rank 0); None when SLURM accepted it, else why not
    (with what to do). SLURM then ends every task and starts the job again, same id."""
    completed = requeue(job_id)
    if completed.error is not None:
        return (f"`scontrol requeue {job_id}` could not run ({completed.error}); `last` is saved: "
                "`elfes resume RUN_DIR` continues the run (`elfes doctor JOB.yaml --test-job` checks scontrol inside "
                "jobs)")
    if completed.code != 0:
        said = completed.said or f"exit code {completed.code}"
        hint = (" (requeues are disabled for this job: JobRequeue=0 without --requeue, or --no-requeue)"
                if "disabled" in said.lower() else "")
        return f"`scontrol requeue {job_id}` failed: {said}{hint}; `last` is saved: `elfes resume RUN_DIR` continues the run"
    log.info(f"elfes: requeued SLURM job {job_id} (scontrol requeue); SLURM ends this attempt and starts the job again")
    return None


def exclude_from_slurm_job(job_id: str, hosts: tuple[str, ...]) -> None:
    """``scontrol update JobId=JOB_ID ExcNodeList=HOSTS`` from inside the job (the rank that requeued it), right
    after ``scontrol requeue``: SLURM takes it only for a pending job, and a requeued one is pending (while its
    tasks end) until it may start again, cred_expire + 1 s later. ``hosts`` are every node the run excludes
    (the list replaces the job's). A refusal only warns: the job comes back, maybe on such a node."""
    completed = exclude_nodes(job_id, hosts)
    if completed.error is not None:
        said = completed.error
    else:
        if completed.code == 0:
            log.info(f"elfes: SLURM job {job_id} leaves out {', '.join(hosts)} when it starts again (ExcNodeList; "
                  "`elfes resume RUN_DIR --include-nodes` allows them again)")
            return
        said = completed.said or f"exit code {completed.code}"
    log.warning(f"elfes: `{completed.command}` failed ({said}); the requeued job may start on those nodes "
                "again")


def cancel_slurm_job(job_id: str) -> None:
    """``scancel JOB_ID`` from inside the job (rank 0, once the attempt recorded "cancelled").

    A cancel can lose to a requeue: ``scontrol requeue`` also requeues a job that ``scancel`` is already
    ending, so the job comes back, sees the cancel marker and ends cancelled, and then nothing would end
    it before its time limit. Cancelling it here makes SLURM end every task now and keeps it cancelled
    (it is not requeued again); when the job is already ending, scancel only says so.
    """
    completed = cancel(job_id, in_job=True)
    if completed.error is not None:
        log.info(f"elfes: `scancel {job_id}` could not run ({completed.error}); the job ends when its tasks exit")
        return
    said = completed.said
    log.info(f"elfes: cancelled SLURM job {job_id} (scancel" + (f": {said}" if said else "") + "); it does not come back")


def end_failed_slurm_job(job_id: str) -> None:
    """``scancel JOB_ID`` from inside a job whose failure is not retried (the rank that decided it, once state.json
    says "failed"). The other tasks may never learn that a rank is gone (waiting for it in the process group's
    rendezvous, or in a collective with a long timeout) and would hold the allocation until the time limit;
    SLURM ends them all now (SIGTERM, SIGKILL KillWait later) and the job is not requeued."""
    completed = cancel(job_id, in_job=True)
    if completed.error is not None:
        log.warning(f"elfes: `scancel {job_id}` could not run ({completed.error}); the job's other tasks run on "
              "until they fail or reach the time limit: `scancel` it")
        return
    said = completed.said
    log.info(f"elfes: ended SLURM job {job_id} (scancel" + (f": {said}" if said else "") + ") so that its other tasks "
          "do not wait for the failed rank: the failure is not retried")


def resubmit_local(paths: RunPaths, task: Any) -> None:
    """Past submitit's local start limit, submit the run again (a "requeue" submission, which the next
    start counts as a requeue) into the same run directory: ``task`` (the job's ``JobRuntime``) in a new
    detached controller; our rank variables are dropped. Rank 0, after recording "requeued". A refusal is
    recorded (the job is ending) and raised."""
    job_id = resubmit_run(paths, task)
    log.info(f"elfes: submitit's local controller starts a job at most {LOCAL_MAX_STARTS} times; "
             f"resubmitted the run as local job {job_id}")


def wait_for_slurm_to_end_the_job() -> None:
    """Never returns: after a SIGTERM stop under SLURM (no cancel marker), `last` is saved and the task
    waits to be killed.

    A job that exits on its own during a preemption's grace time is not requeued (it ends COMPLETED or
    FAILED); one that SLURM kills in PreemptMode=REQUEUE is. A cancelled attempt does not wait: it
    ``scancel``s the job (:func:`cancel_slurm_job`) and exits.
    """
    log.info("elfes: `last` is saved; waiting for SLURM to end the job (a preempted job is requeued by SLURM; "
             "`elfes cancel` keeps it from coming back)")
    while True:
        time.sleep(60)
