"""ELFES's local controller: submitit's, which also records how each task ended.

Only a process's parent sees its exit status, and a local job's tasks are the children of its controller. A
rank killed by a signal (SIGKILL, the out-of-memory killer) writes nothing, so its peers only see their
connection to it close; the controller's record (``RunPaths.task_exit``) lets the rank that decides the failed
attempt name the signal: "rank 1 was killed by SIGKILL at step 12" (launcher/job/failures.py).

Everything else is submitit's ``Controller`` unchanged: it starts one task per rank, forwards SIGTERM to them,
sends the timeout signal, and starts them all again, at most six times, when one exited with
``LOCAL_REQUEUE_RETURN_CODE``. :class:`ElfesLocalExecutor` is submitit's ``LocalExecutor`` whose submission
starts this module, ``python -m elfes.launcher.submit.local_controller RUN_DIR/submitit``, in place of
``submitit.local._local`` (the name liveness looks for in /proc: launcher/rundir/liveness.py). Torch-free.

>>> job = ElfesLocalExecutor(folder=RunPaths(run_dir).submitit).submit(runtime)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from submitit.local.local import Controller, LocalExecutor, LocalJob

from ..backends import Executor
from ..rundir.liveness import LOCAL_CONTROLLER_MODULE
from ..rundir.paths import RunPaths
from ..rundir.task_files import write_task_exit


class RecordedTask:
    """One task's ``Popen`` whose exit status is recorded the first time :meth:`poll` sees it (the controller
    polls every task 24 times a second)."""

    def __init__(self, process: subprocess.Popen[Any], *, rank: int, job_id: str, paths: RunPaths) -> None:
        self.process = process
        self.rank = rank
        self.job_id = job_id
        self.paths = paths
        self.recorded = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        returncode = self.process.poll()
        if returncode is not None and not self.recorded:
            self.recorded = True
            try:
                write_task_exit(self.paths, job_id=self.job_id, rank=self.rank, pid=self.process.pid,
                                returncode=returncode)
            except OSError as error:  # the job goes on; a failure's cause then says less
                print(f"elfes: the exit status of rank {self.rank} could not be recorded ({error})", flush=True)
        return returncode

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)


class RecordingController(Controller):
    """submitit's controller whose tasks record their exit status (:class:`RecordedTask`)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.paths = RunPaths.of_submitit_folder(folder)

    def start_tasks(self) -> None:
        super().start_tasks()  # task k is rank k (SUBMITIT_LOCAL_GLOBALID)
        # submitit's wait() and kill_tasks() only poll and signal the tasks: a RecordedTask does both.
        self.tasks = [RecordedTask(task, rank=rank, job_id=self.pid, paths=self.paths)  # type: ignore[misc]  # submitit types them Popen; it polls and signals them, as RecordedTask does
                      for rank, task in enumerate(self.tasks)]


class ElfesLocalExecutor(LocalExecutor):
    """submitit's ``LocalExecutor`` whose job is run by :class:`RecordingController`. The controller's settings
    travel as submitit's do (its ``SUBMITIT_LOCAL_*`` variables); it runs without a shell (the job id is its pid),
    so the executor's ``setup`` lines are refused."""

    def _submit_command(self, command: str) -> LocalJob[Any]:
        if self.parameters.get("setup"):
            raise ValueError("the ELFES local executor runs no setup lines (the spec's env is exported instead)")
        tasks = int(self.parameters.get("tasks_per_node", 1))
        gpus = int(self.parameters.get("gpus_per_node", 0))
        visible = tuple(self.parameters.get("visible_gpus", ())) or tuple(range(gpus))
        environment = {
            **os.environ,
            "SUBMITIT_LOCAL_NTASKS": str(tasks),
            "SUBMITIT_LOCAL_COMMAND": command,
            "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * self.parameters.get("timeout_min", 2.0))),
            "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(self.parameters.get("signal_delay_s", 30))),
            "SUBMITIT_LOCAL_NODEID": "0",
            "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
            "SUBMITIT_STDERR_TO_STDOUT": "1" if self.parameters.get("stderr_to_stdout") else "",
            "SUBMITIT_EXECUTOR": Executor.LOCAL.value,
            "CUDA_VISIBLE_DEVICES": ",".join(str(device) for device in visible[:gpus]),
            "SUBMITIT_LOCAL_WITH_SHELL": "",
        }
        # Outlives this process, like submitit's controller: its LocalJob polls it and nothing waits on it here.
        process = subprocess.Popen([sys.executable, "-m", LOCAL_CONTROLLER_MODULE, str(self.folder)], env=environment)
        return LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(tasks)))


def main(arguments: list[str]) -> None:
    """``python -m elfes.launcher.submit.local_controller RUN_DIR/submitit``: run the job (settings in the
    environment), then exit."""
    if len(arguments) != 1:
        raise SystemExit(f"usage: python -m {LOCAL_CONTROLLER_MODULE} RUN_DIR/submitit")
    RecordingController(Path(arguments[0])).run()


if __name__ == "__main__":
    main(sys.argv[1:])
