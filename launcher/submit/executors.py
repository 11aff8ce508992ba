"""Executors: how a job spec reaches SLURM or this machine. The only importer of submitit's executors.

Torch-free. Two executors, both through submitit, both submitting the same picklable callable,
``JobRuntime(run_dir)`` (launcher/job/runtime.py), which runs one task of one attempt inside the job:

- ``slurm``: ``submitit.SlurmExecutor`` with ``--requeue``, ``--signal=USR2@<slurm.signal_delay_s>``,
  ``--open-mode=append`` (submitit's), ``--chdir=<workdir>``, the spec's ``env`` exported and its
  ``setup`` lines run in the batch script, logs in ``RUN_DIR/submitit``. Every ``#SBATCH`` value is
  quoted the way sbatch reads it (:func:`sbatch_quote`), env values for bash; the spec refused control
  characters in all of them. Before anything is created, ``check_executor`` asks the cluster, where one
  answers, whether it has the spec's partition, account and QOS (launcher/submit/cluster_checks.py).
- ``local``: ``submitit.LocalExecutor``: a controller process on this machine starts one task per
  rank (``tasks_per_node``; one per GPU when ``gpus_per_node`` > 0) and relaunches them when they
  exit for a requeue; it is submitit's controller that also records how each task ended, the exit
  status a failed attempt's cause names (launcher/submit/local_controller.py). The controller is started from a short-lived child in a session of its own,
  with its standard streams on ``RUN_DIR/submitit/controller.log``: a caller reading ``elfes submit``'s
  output is not held until the job ends, and a Ctrl-C in the submitter's terminal does not reach the job.

>>> text = dry_run(spec, RunPaths(spec.run_dir), "slurm")     # the sbatch script; touches nothing  # doctest: +SKIP
>>> job_id = submit(spec, RunPaths(spec.run_dir), "local")    # starts the job; returns its id  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends import Executor, ExecutorError, backend_for, choose_executor
from ..errors import EXIT_NOT_NOW, ElfesError
from ..rundir.paths import RunPaths, SweepPaths
from ..slurm import slurm_configured
from ..spec.models import JobSpec
from .cluster_checks import cluster_problems
from .scripts import (
    job_environment,
    local_parameters,
    local_plan,
    sbatch_script,
    slurm_executor,
    slurm_parameters,
    visible_gpus,
)

__all__ = ["ExecutorError", "SubmissionError", "check_executor", "choose_executor", "dry_run", "submit",
           "local_plan", "sbatch_script", "slurm_configured", "slurm_parameters"]
# The CPU ranks a local job may start per CPU of this machine: a few share a core well enough for a test or a
# rehearsal (gloo ranks wait on one another), beyond that each update waits on ranks that hardly run.
LOCAL_RANKS_PER_CPU = 4


class SubmissionError(ElfesError, RuntimeError):
    """The executor refused or failed the submission (sbatch error, no SLURM here)."""

    exit_code = EXIT_NOT_NOW


# Characters of a path that sbatch and srun read in --output and --error: their names, and how they read them.
SBATCH_PATH_CHARACTERS = {
    "%": ("'%'", "as a file-name pattern (%j, %u, ...)"),
    "\\": ("a backslash", "as turning the file-name patterns (%j) off, and drops it,"),
}


def check_executor(spec: JobSpec, executor: Executor) -> None:
    """Refuse, naming the field, a spec the executor cannot run (raises :class:`ExecutorError`); on
    ``slurm``, also a partition, account or QOS that the cluster, where one answers, does not have."""
    _submission(executor).check(spec)


def _check_slurm(spec: JobSpec) -> None:
    for character, (name, reading) in SBATCH_PATH_CHARACTERS.items():
        if character in str(spec.run_dir):
            raise ExecutorError(
                f"run_dir = {str(spec.run_dir)!r}: contains {name}, which sbatch reads {reading} in the job's "
                f"log paths below it, so the logs would go elsewhere; give a run directory without {name} for SLURM")
    problems = cluster_problems(spec)
    if problems:
        raise ExecutorError("\n".join(problems))


def _check_local(spec: JobSpec) -> None:
    if spec.resources.nodes != 1:
        raise ExecutorError(
            f"resources.nodes = {spec.resources.nodes}: the local executor runs on this machine only (1 node); "
            "set nodes: 1, or submit with --executor slurm"
        )
    tasks, cpus = spec.resources.tasks_per_node, usable_cpus()
    if tasks > LOCAL_RANKS_PER_CPU * cpus:
        gpus = visible_gpus()
        raise ExecutorError(
            f"resources.tasks_per_node = {tasks}: this machine has {cpus} CPU(s) and {len(gpus) or 'no'} GPU(s), and "
            f"the local executor starts at most {LOCAL_RANKS_PER_CPU} ranks per CPU ({LOCAL_RANKS_PER_CPU * cpus} here); "
            "lower tasks_per_node, or submit with --executor slurm")
    wanted = spec.resources.gpus_per_node
    if wanted > 0:
        visible = visible_gpus()
        if len(visible) < wanted:
            raise ExecutorError(
                f"resources.gpus_per_node = {wanted}: this machine shows {len(visible)} GPU(s) "
                f"({', '.join(map(str, visible)) or 'none'}); set gpus_per_node: 0 to train on CPU ranks with gloo, "
                "lower it, or submit with --executor slurm"
            )


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity
        return os.cpu_count() or 1


# -- SLURM ------------------------------------------------------------------------------------------------------
@contextmanager
def submitit_files_undone_on_failure(paths: RunPaths | SweepPaths) -> Iterator[None]:
    """A submission that raises leaves submitit's folder as it found it: the pickles and sbatch scripts
    it wrote are removed, what it appended to the controller log is cut off, a folder it created goes."""
    folder = paths.submitit
    existed = folder.is_dir()
    before = {entry.name: entry.lstat().st_size for entry in folder.iterdir()} if existed else {}
    try:
        yield
    except BaseException:
        if not existed:
            shutil.rmtree(folder, ignore_errors=True)
        elif folder.is_dir():
            for entry in folder.iterdir():
                if entry.name not in before:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink(missing_ok=True)
                elif entry.is_file() and entry.lstat().st_size > before[entry.name]:
                    os.truncate(entry, before[entry.name])
        raise


def _submit_slurm(spec: JobSpec, paths: RunPaths, runtime: Any, exclude: tuple[str, ...]) -> str:
    with submitit_files_undone_on_failure(paths):
        return _sbatch(spec, paths, runtime, exclude)


def _sbatch(spec: JobSpec, paths: RunPaths, runtime: Any, exclude: tuple[str, ...] = ()) -> str:
    try:
        executor = slurm_executor(paths.submitit)
    except RuntimeError as error:
        raise SubmissionError(f"SLURM is not available here ({error}); submit from a SLURM login node, "
                              "or use --executor local") from None
    executor.update_parameters(**slurm_parameters(spec, exclude=exclude))
    try:
        # submitit prints sbatch's stderr itself before raising it: the error below says it once.
        with contextlib.redirect_stderr(io.StringIO()):
            job = executor.submit(runtime)
    except Exception as error:  # sbatch's refusal arrives as one of several submitit/subprocess errors
        hint = "" if slurm_configured() else (
            " (no SLURM configuration found: set SLURM_CONF, or use --executor local on a machine without a cluster)")
        if exclude:
            hint += (f" (the run leaves out {', '.join(exclude)} after failures there, requeue.exclude_failed_nodes: "
                     f"`elfes resume {paths.run_dir} --include-nodes` allows them again)")
        raise SubmissionError(f"sbatch refused job {spec.name}{hint}: {str(error).strip()}") from None
    return str(job.job_id)


# -- local ------------------------------------------------------------------------------------------------------
def _reset_signals() -> None:
    # A rank that resubmits has flag-only handlers and may ignore signals; the controller (exec'd, so
    # handlers reset) would still inherit an ignored disposition.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT):
        signal.signal(signum, signal.SIG_DFL)


def _submit_local(spec: JobSpec, paths: RunPaths, runtime: Any, exclude: tuple[str, ...] = ()) -> str:
    """Submit through ``LocalExecutor`` from a forked child in a new session whose standard streams
    are the controller log; the controller outlives the child (and this process). ``exclude``: nothing to leave
    out on one machine."""
    with submitit_files_undone_on_failure(paths):
        log_size = paths.controller_log.stat().st_size if paths.controller_log.is_file() else 0
        try:
            return _start_local_controller(spec, paths, runtime)
        except SubmissionError as error:
            appended = _read_from(paths.controller_log, log_size).strip()
            raise SubmissionError(f"{error}" + (f"; it wrote: {appended[-2000:]}" if appended else "")) from None


def _read_from(file: Path, offset: int) -> str:
    try:
        with open(file, "rb") as stream:
            stream.seek(offset)
            return stream.read().decode(errors="replace")
    except OSError:
        return ""


def _start_local_controller(spec: JobSpec, paths: RunPaths, runtime: Any) -> str:
    paths.submitit.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()  # or the child would write our buffered output into the controller log
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(reader)
            os.setsid()
            _reset_signals()
            stdin = os.open(os.devnull, os.O_RDONLY)
            log = os.open(paths.controller_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(stdin, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            environment = job_environment(spec)
            os.environ.clear()
            os.environ.update(environment)
            os.chdir(spec.workdir)
            from .local_controller import ElfesLocalExecutor

            executor = ElfesLocalExecutor(folder=paths.submitit)
            executor.update_parameters(**local_parameters(spec))
            job = executor.submit(runtime)
            os.write(writer, json.dumps({"job_id": str(job.job_id)}).encode())
            code = 0
        except BaseException as error:  # noqa: B036 - reported to the parent, which raises it
            os.write(writer, json.dumps({"error": f"{type(error).__name__}: {error}"}).encode())
        finally:
            os._exit(code)
    os.close(writer)
    chunks = []
    with os.fdopen(reader, "rb") as stream:
        while chunk := stream.read(65536):
            chunks.append(chunk)
    os.waitpid(pid, 0)
    try:
        reply = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        reply = {}
    if "job_id" not in reply:
        raise SubmissionError(f"the local executor could not start job {spec.name}: "
                              f"{reply.get('error', 'no reply from the submitting child')}")
    return str(reply["job_id"])


# -- the verbs' entry points ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Submission:
    """How a job reaches one backend (launcher/backends/): refusing a spec it cannot run, the text a dry run
    shows, and the submission of one run's task with the nodes it leaves out; the job id it answers."""

    check: Callable[[JobSpec], None]
    dry_run: Callable[[JobSpec, RunPaths], str]
    submit: Callable[[JobSpec, RunPaths, Any, tuple[str, ...]], str]


# One per backend of launcher/backends/__init__.py's BACKENDS (tests/test_backend_seams.py checks both lists).
SUBMISSIONS: dict[Executor, Submission] = {
    Executor.SLURM: Submission(_check_slurm, sbatch_script, _submit_slurm),
    Executor.LOCAL: Submission(_check_local, local_plan, _submit_local),
}


def _submission(executor: Executor) -> Submission:
    return SUBMISSIONS[backend_for(executor).executor]  # ExecutorError for an executor that names no backend


def dry_run(spec: JobSpec, paths: RunPaths, executor: Executor) -> str:
    """The sbatch script (``slurm``) or the local command (``local``) a submission would use."""
    check_executor(spec, executor)
    return _submission(executor).dry_run(spec, paths)


def submit(spec: JobSpec, paths: RunPaths, executor: Executor, task: Any, *, exclude: tuple[str, ...] = ()) -> str:
    """Submit ``task`` (the job's picklable ``JobRuntime(run_dir)``) for ``spec`` on ``executor``; return the job id.

    Callers: the one hand-over (launcher/submit/transaction.py) of ``elfes submit``/``resume`` and of a local job's
    rank 0 resubmitting past submitit's six starts. The run directory must hold the recorded spec and state
    already. ``exclude``: nodes the job leaves out (the run's exclusions after failures, where its backend
    excludes nodes). Raises :class:`ExecutorError` (spec unfit for the executor) or :class:`SubmissionError`.
    """
    check_executor(spec, executor)
    return _submission(executor).submit(spec, paths, task, tuple(exclude))
