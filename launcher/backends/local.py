"""The local backend: a run's job is submitit's controller on this machine, starting one task per rank. Its
processes are the job (found in /proc, signalled by pid); a task leaves for a relaunch with
:data:`LOCAL_REQUEUE_EXIT_CODE`, on which the controller starts every task again, counting the starts itself,
at most :data:`LOCAL_MAX_STARTS` times: past that, rank 0 resubmits the run (a new controller). Nothing waits
for a scheduler, nothing keeps queue times. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from elfes.files import write_text_atomically

from ..slurm import TOOL_TIMEOUT_S, Answer
from .base import Executor

if TYPE_CHECKING:
    from ..slurm import JobStart, QueueEntry, SlurmQueue
    from ..spec.models import JobSpec

# submitit's local controller relaunches all tasks when any exits with this code
# (submitit.local.local.LOCAL_REQUEUE_RETURN_CODE).
LOCAL_REQUEUE_EXIT_CODE = 144
# submitit's local controller starts a job at most this often (Controller.run(max_retry=6)); a local
# requeue past that is a resubmission into the same run directory.
LOCAL_MAX_STARTS = 6


class LocalBackend:
    executor = Executor.LOCAL
    runs_here = True
    liveness_every_s = 1.0  # /proc answers at once
    status_poll_s = 0.5
    outlives_its_end = False
    signals_every_process = False  # the controller signals the tasks; a task forwards to its command
    kills_stragglers = False  # the task sends SIGKILL after resources.kill_wait_s itself
    relaunch_exit_code = LOCAL_REQUEUE_EXIT_CODE
    requeues_from_inside = False  # the exit status asks the controller
    sweeps_as_arrays = False

    def queued(self, job_id: str, snapshot: SlurmQueue | None = None) -> QueueEntry | None:
        return None  # no queue: its processes are the job (runs_here)

    def job_name(self, job_id: str | None) -> str:
        return f"local job {job_id}"

    def jobs_name(self, job_ids: Collection[str]) -> str:
        return "local jobs started by the sweep's scheduler"

    def excludes_failed_nodes(self, spec: JobSpec) -> bool:
        return False  # one machine: nothing to leave out

    def restart(self, start_count: Path, *, job: str) -> int:
        """This rank's start within ``job`` (its id and submission number) minus one: submitit's controller sets
        no restart count, so each rank counts its own starts in ``start_count``."""
        try:
            recorded = json.loads(start_count.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            recorded = {}
        starts = recorded.get("starts", 0) + 1 if recorded.get("job") == job else 1
        start_count.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(start_count, json.dumps({"job": job, "starts": starts}) + "\n")
        return starts - 1

    def resubmits(self, restart: int) -> bool:
        return restart + 1 >= LOCAL_MAX_STARTS

    def requeue(self, job_id: str) -> str | None:
        return None  # the relaunch exit status asks the controller

    def exclude(self, job_id: str, hosts: tuple[str, ...]) -> None:
        return None

    def end_cancelled(self, job_id: str) -> None:
        return None  # nothing requeues a local job behind its back

    def end_unretried(self, job_id: str, world_size: int) -> None:
        return None  # the controller ends the other tasks when one exits

    def signal(self, job_id: str, signal_name: str, *, every_process: bool = False,
               timeout_s: float = TOOL_TIMEOUT_S) -> Answer:
        return _through_its_tasks(job_id, f"SIG{signal_name}")

    def cancel(self, job_id: str) -> Answer:
        return _through_its_tasks(job_id, "a cancel")

    def queue_starts(self, job_ids: Collection[str]) -> Mapping[str, tuple[JobStart, ...]]:
        return {}


def _through_its_tasks(job_id: str, what: str) -> Answer:
    return Answer(argv=("kill", job_id), code=None,
                  error=f"{what} reaches a local job through its tasks' pids (the run directory's records), not its id")
