"""What runs inside the job, on every task: signals, the entrypoint or command, the outcome, the requeue.

``JobRuntime(run_dir)`` is what the launcher submits through submitit; each task (rank) unpickles it
and calls it. In order, on every rank:

1. Flag-only handlers for SIGTERM, SIGINT and the requeue signal (submitit's, SIGUSR2 unless
   ``SUBMITIT_PREEMPT_SIGNAL`` says otherwise) replace submitit's own (which would checkpoint and exit
   inside the handler). Nothing else happens in a handler. The launcher's own lines in the logs carry a
   time and a level from now on (launcher/job/job_log.py).
2. The attempt's context is read once and frozen (launcher/job/attempt_context.py): the start identified (job
   id and restart number, the same on every rank) and numbered (attempts count from 1 across the whole run,
   ``elfes resume`` included), the spec read.
3. The attempt begins (launcher/job/attempt_runner.py): the rank's standard streams go to
   ``logs/attempt-<A>/rank-<R>.out|err`` and the task's pid is recorded (``pids/rank-<R>.json``) so
   ``elfes preempt`` can signal it; rank 0 records the attempt in ``state.json``.
4. The spec's ``env`` is applied, the code snapshot the run records (``code.json``; else ``workdir``) becomes
   the working folder and goes on ``sys.path``, where the working tree it copies is no longer,
   the torch distributed variables are exported (submitit's ``TorchDistributedEnvironment``) and,
   with ``gpus_per_node: 0``, ``ACCELERATE_USE_CPU=1`` (so a plain ``Accelerator()`` forms a gloo group).
5. ``entrypoint``: the engine is imported (torch, seconds), a ``StopRequest`` takes over the signals
   (those that arrived during the import are handed to it) and ``main(job)`` runs with a :class:`Job`.
   ``command``: the command runs as the leader of a process group of its own; stop signals are
   forwarded to the whole group, which is reaped before the outcome is told by its exit code (0
   finished; 128 + a stop signal's number paused; anything else failed; launcher/job/command.py).
6. The outcome, the same on every rank (the trainer agrees on one stop reason for all ranks;
   launcher/job/outcome.py), recorded and carried out (launcher/job/attempt_end.py): finished; requeued (the
   requeue signal, while requeues are left: SLURM: rank 0 runs ``scontrol requeue`` and every rank exits
   through ``SystemExit``; local: every rank exits 144 and submitit's controller relaunches, or, past its six
   starts, rank 0 resubmits into the same run directory); stopped or cancelled (SIGTERM/SIGINT, or no
   requeue left: ``last`` is saved; locally the task returns; under SLURM a stopped task waits until SLURM
   ends it, so that a preempted job is requeued by SLURM, while a cancelled attempt (the cancel marker) has
   rank 0 ``scancel`` the job and every rank return, so that it never comes back; a cancel marker seen right
   before ``scontrol requeue`` turns the requeue into a cancel); failed (an exception, a nonzero exit, a lost
   rank, a hang: every failing rank publishes its report, and the first to fail records the attempt's end
   and decides whether it is retried, launcher/job/failures.py; that rank then carries the retry out, or
   ends a multi-task SLURM job whose failure is not retried with ``scancel``, so that no healthy rank waits
   on for the failed one until the time limit, launcher/job/failed_attempt.py).

The rooms below it, one job each: launcher/job/signals.py (the stop signals and the flag-only handlers),
launcher/job/attempt_context.py (what a task knows of its attempt from the start),
launcher/job/distributed_env.py (who this task is and the torch distributed environment),
launcher/rundir/task_files.py (the task's logs, pid file, cancel marker), launcher/job/attempt_runner.py (one
attempt, top to bottom), launcher/job/entrypoint.py (``main(job)``'s argument), launcher/job/command.py
(running a ``command:``), launcher/job/outcome.py (what an attempt's end means, pure),
launcher/job/attempt_end.py (carrying an end out; every exit code), launcher/job/failures.py (what a failure
means, pure), launcher/job/failed_attempt.py (acting on a failure) and launcher/job/requeue.py (the SLURM and
local commands an end runs).

This module imports neither torch nor the engine at import time: the submitter pickles
``JobRuntime`` by reference.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..rundir.paths import RunPaths
from .attempt_context import AttemptContext
from .attempt_runner import AttemptRunner
from .entrypoint import Job, release_process_group
from .job_log import job_logging
from .signals import SignalFlags, stop_signals

__all__ = ["Job", "JobRuntime", "release_process_group"]  # Job: documented as elfes.launcher.job.runtime.Job


class JobRuntime:
    """The callable the launcher submits: ``executor.submit(JobRuntime(run_dir))``. Every task calls it.

    Returns a small plain dict (``{"outcome", "attempt", "step"}``) when the attempt ends without a
    requeue; exits through ``SystemExit`` when it requeues; re-raises a user error after recording it.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = str(Path(run_dir).resolve())

    def __repr__(self) -> str:
        return f"JobRuntime({self.run_dir!r})"

    def __call__(self) -> dict[str, Any]:
        flags = SignalFlags(stop_signals()).install()  # first act: flags only, replacing submitit's handlers
        with job_logging():
            context = AttemptContext.read(RunPaths(self.run_dir))
            return AttemptRunner(context, flags, task=self).run()
