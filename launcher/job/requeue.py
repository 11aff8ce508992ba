"""Carrying out an attempt's decision on its backend from inside the job (launcher/backends/: a SLURM job
requeues itself with ``scontrol requeue``; a local job exits for submitit's controller to relaunch it): a
relaunch past the controller's start limit resubmits the run, and a job that stopped on SIGTERM under a
scheduler that ends it waits to be ended. Inside the job; torch-free.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..backends import Executor, backend_for
from ..rundir.paths import RunPaths
from ..submit.transaction import resubmit_run

log = logging.getLogger(__name__)


def resubmit(paths: RunPaths, task: Any, executor: Executor) -> None:
    """Past the controller's start limit (``Backend.resubmits``), submit the run again (a "requeue" submission,
    which the next start counts as a requeue) into the same run directory: ``task`` (the job's ``JobRuntime``) in a
    new detached controller; our rank variables are dropped. Rank 0, after recording "requeued". A refusal is
    recorded (the job is ending) and raised."""
    job_id = resubmit_run(paths, task, executor)
    log.info("elfes: the job's controller is past its start limit: "
             f"resubmitted the run as {backend_for(executor).job_name(job_id)}")


def wait_for_the_scheduler_to_end_the_job() -> None:
    """Never returns: after a SIGTERM stop on a backend whose scheduler ends the job (``outlives_its_end``; no
    cancel marker), `last` is saved and the task waits to be killed.

    A job that exits on its own during a preemption's grace time is not requeued (it ends COMPLETED or
    FAILED); one that SLURM kills in PreemptMode=REQUEUE is. A cancelled attempt does not wait: it
    ends its job (``Backend.end_cancelled``) and exits.
    """
    log.info("elfes: `last` is saved; waiting for SLURM to end the job (a preempted job is requeued by SLURM; "
             "`elfes cancel` keeps it from coming back)")
    while True:
        time.sleep(60)
