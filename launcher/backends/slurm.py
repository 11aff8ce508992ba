"""The SLURM backend: a run's job is a SLURM job (submitted with ``--requeue``); the cluster's queue says whether
it lives, ``scontrol requeue`` from inside the job relaunches it with the same id (``SLURM_RESTART_COUNT`` counts
the starts), a task leaves a relaunch with 0 (a nonzero exit would end the requeued job "failed"), and a job
that stopped on SIGTERM waits for SLURM to end it, which requeues it on a preemption. Every command goes
through launcher/slurm/. Torch-free.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..slurm import (
    TOOL_TIMEOUT_S,
    Answer,
    JobStart,
    QueueEntry,
    SlurmQueue,
    cancel,
    exclude_nodes,
    job_starts,
    queue_entry,
    requeue,
    signal_job,
)
from .base import Executor

if TYPE_CHECKING:
    from ..spec.models import JobSpec

log = logging.getLogger("elfes.launcher.job.requeue")  # the in-job runtime's logger for a requeue's lines


class SlurmBackend:
    executor = Executor.SLURM
    runs_here = False
    liveness_every_s = 30.0  # squeue loads the cluster's controller
    status_poll_s = 5.0
    outlives_its_end = True
    signals_every_process = True  # every process of the step
    kills_stragglers = True  # KillWait after the signal
    relaunch_exit_code = 0  # scontrol requeue already relaunched it
    requeues_from_inside = True
    sweeps_as_arrays = True

    def queued(self, job_id: str, snapshot: SlurmQueue | None = None) -> QueueEntry | None:
        return snapshot.entry(job_id) if snapshot is not None else queue_entry(job_id)

    def job_name(self, job_id: str | None) -> str:
        return f"SLURM job {job_id}"

    def jobs_name(self, job_ids: Collection[str]) -> str:
        return f"SLURM job array {', '.join(job_ids)}"

    def excludes_failed_nodes(self, spec: JobSpec) -> bool:
        return spec.requeue.exclude_failed_nodes

    def restart(self, start_count: Path, *, job: str) -> int:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)

    def resubmits(self, restart: int) -> bool:
        return False  # SLURM requeues a job as often as max_requeues allows

    def requeue(self, job_id: str) -> str | None:
        """``scontrol requeue JOB_ID`` from inside the job (rank 0); SLURM then ends every task and starts the job
        again, same id."""
        completed = requeue(job_id)
        if completed.error is not None:
            return (f"`scontrol requeue {job_id}` could not run ({completed.error}); `last` is saved: "
                    "`elfes resume RUN_DIR` continues the run (`elfes doctor JOB.yaml --test-job` checks scontrol "
                    "inside jobs)")
        if completed.code != 0:
            said = completed.said or f"exit code {completed.code}"
            hint = (" (requeues are disabled for this job: JobRequeue=0 without --requeue, or --no-requeue)"
                    if "disabled" in said.lower() else "")
            return (f"`scontrol requeue {job_id}` failed: {said}{hint}; `last` is saved: `elfes resume RUN_DIR` "
                    "continues the run")
        log.info(f"elfes: requeued SLURM job {job_id} (scontrol requeue); SLURM ends this attempt and starts the job "
                 "again")
        return None

    def exclude(self, job_id: str, hosts: tuple[str, ...]) -> None:
        """``scontrol update JobId=JOB_ID ExcNodeList=HOSTS`` right after ``scontrol requeue``: SLURM takes it only
        for a pending job, and a requeued one is pending (while its tasks end) until it may start again,
        cred_expire + 1 s later. ``hosts`` replace the job's list. A refusal only warns."""
        completed = exclude_nodes(job_id, hosts)
        if completed.error is not None:
            said = completed.error
        else:
            if completed.code == 0:
                log.info(f"elfes: SLURM job {job_id} leaves out {', '.join(hosts)} when it starts again (ExcNodeList; "
                         "`elfes resume RUN_DIR --include-nodes` allows them again)")
                return
            said = completed.said or f"exit code {completed.code}"
        log.warning(f"elfes: `{completed.command}` failed ({said}); the requeued job may start on those "
                    "nodes again")

    def end_cancelled(self, job_id: str) -> None:
        """``scancel JOB_ID`` (rank 0, once the attempt recorded "cancelled"). A cancel can lose to a requeue:
        ``scontrol requeue`` also requeues a job that ``scancel`` is already ending, so the job comes back, sees the
        cancel marker and ends cancelled; cancelling it here ends every task now and keeps it cancelled."""
        completed = cancel(job_id, in_job=True)
        if completed.error is not None:
            log.info(f"elfes: `scancel {job_id}` could not run ({completed.error}); the job ends when its tasks exit")
            return
        said = completed.said
        log.info(f"elfes: cancelled SLURM job {job_id} (scancel" + (f": {said}" if said else "")
                 + "); it does not come back")

    def end_unretried(self, job_id: str, world_size: int) -> None:
        """``scancel JOB_ID`` from inside a multi-task job whose failure is not retried: the other tasks may never
        learn that a rank is gone (a rendezvous, a collective with a long timeout) and would hold the allocation
        until the time limit; SLURM ends them all now and the job is not requeued."""
        if world_size <= 1:
            return
        completed = cancel(job_id, in_job=True)
        if completed.error is not None:
            log.warning(f"elfes: `scancel {job_id}` could not run ({completed.error}); the job's other tasks "
                        "run on until they fail or reach the time limit: `scancel` it")
            return
        said = completed.said
        log.info(f"elfes: ended SLURM job {job_id} (scancel" + (f": {said}" if said else "") + ") so that its other "
                 "tasks do not wait for the failed rank: the failure is not retried")

    def signal(self, job_id: str, signal_name: str, *, every_process: bool = False,
               timeout_s: float = TOOL_TIMEOUT_S) -> Answer:
        return signal_job(job_id, signal_name, full=every_process, timeout_s=timeout_s)

    def cancel(self, job_id: str) -> Answer:
        return cancel(job_id)

    def queue_starts(self, job_ids: Collection[str]) -> Mapping[str, tuple[JobStart, ...]]:
        return (job_starts(job_ids) or {}) if job_ids else {}
