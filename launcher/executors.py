"""Executors: how a job spec reaches SLURM or this machine. The only importer of submitit's executors.

Torch-free. Two executors, both through submitit, both submitting the same picklable callable,
``JobRuntime(run_dir)`` (launcher/runtime.py), which runs one task of one attempt inside the job:

- ``slurm``: ``submitit.SlurmExecutor`` with ``--requeue``, ``--signal=USR2@<slurm.signal_delay_s>``,
  ``--open-mode=append`` (submitit's), ``--chdir=<workdir>``, the spec's ``env`` exported and its
  ``setup`` lines run in the batch script, logs in ``RUN_DIR/submitit``. Every ``#SBATCH`` value is
  quoted the way sbatch reads it (:func:`sbatch_quote`), env values for bash; the spec refused control
  characters in all of them. Before anything is created, ``check_executor`` asks the cluster, where one
  answers, whether it has the spec's partition, account and QOS (launcher/cluster_checks.py).
- ``local``: ``submitit.LocalExecutor``: a controller process on this machine starts one task per
  rank (``tasks_per_node``; one per GPU when ``gpus_per_node`` > 0) and relaunches them when they
  exit for a requeue. The controller is started from a short-lived child in a session of its own,
  with its standard streams on ``RUN_DIR/submitit/controller.log``: a caller reading ``elfes submit``'s
  output is not held until the job ends, and a Ctrl-C in the submitter's terminal does not reach the job.

>>> text = dry_run(spec, RunPaths(spec.run_dir), "slurm")     # the sbatch script; touches nothing
>>> job_id = submit(spec, RunPaths(spec.run_dir), "local")    # starts the job; returns its id
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from .cluster_checks import cluster_problems
from .paths import RunPaths
from .spec_models import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES, JobSpec

EXECUTORS = ("auto", "slurm", "local")

# Variables of a surrounding job that must not leak into a job this process submits (a local job's
# rank 0 resubmits past submitit's start limit from inside the job).
_JOB_ENV_NAMES = RESERVED_ENV_NAMES | {"GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE"}
_JOB_ENV_PREFIXES = (*RESERVED_ENV_PREFIXES, "TORCHELASTIC_")


class ExecutorError(ValueError):
    """The spec cannot run on the chosen executor (bad input: nothing was created)."""


class SubmissionError(RuntimeError):
    """The executor refused or failed the submission (sbatch error, no SLURM here)."""


SLURM_CONFIG_FILES = (Path("/etc/slurm/slurm.conf"), Path("/etc/slurm-llnl/slurm.conf"))


def slurm_configured() -> bool:
    """Whether SLURM's client commands can find a cluster: ``SLURM_CONF``, a ``slurm.conf`` in its
    usual places, or (configless clusters) a controller that answers ``scontrol ping``."""
    if os.environ.get("SLURM_CONF") or any(path.is_file() for path in SLURM_CONFIG_FILES):
        return True
    if shutil.which("scontrol") is None:
        return False
    try:
        return subprocess.run(["scontrol", "ping"], capture_output=True, timeout=15, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def slurm_available() -> bool:
    """Whether ``auto`` means SLURM here: ``sbatch`` is on PATH and a SLURM configuration is found
    (the client packages alone, without a cluster, do not count)."""
    return shutil.which("sbatch") is not None and slurm_configured()


def choose_executor(requested: str) -> str:
    """``"slurm"`` or ``"local"`` for ``requested`` (``auto``: SLURM where :func:`slurm_available`)."""
    if requested not in EXECUTORS:
        raise ExecutorError(f"executor {requested!r} is unknown; use one of {', '.join(EXECUTORS)}")
    if requested == "auto":
        return "slurm" if slurm_available() else "local"
    return requested


def requeue_signal() -> signal.Signals:
    """The signal that asks a job to save and requeue: submitit's (SIGUSR2 unless
    ``SUBMITIT_PREEMPT_SIGNAL`` names another), the one in ``--signal=USR2@N``."""
    from submitit.core.job_environment import JobEnvironment

    return signal.Signals(JobEnvironment._usr_sig())


def check_executor(spec: JobSpec, executor: str) -> None:
    """Refuse, naming the field, a spec the executor cannot run (raises :class:`ExecutorError`); on
    ``slurm``, also a partition, account or QOS that the cluster, where one answers, does not have."""
    if executor == "slurm":
        if "%" in str(spec.run_dir):
            raise ExecutorError(
                f"run_dir = {str(spec.run_dir)!r}: contains '%', which sbatch reads as a file-name pattern (%j, %u, "
                "...) in the job's log paths below it; give a run directory without '%' for SLURM")
        problems = cluster_problems(spec)
        if problems:
            raise ExecutorError("\n".join(problems))
        return
    if executor != "local":
        return
    if spec.resources.nodes != 1:
        raise ExecutorError(
            f"resources.nodes = {spec.resources.nodes}: the local executor runs on this machine only (1 node); "
            "set nodes: 1, or submit with --executor slurm"
        )
    wanted = spec.resources.gpus_per_node
    if wanted > 0:
        visible = visible_gpus()
        if len(visible) < wanted:
            raise ExecutorError(
                f"resources.gpus_per_node = {wanted}: this machine shows {len(visible)} GPU(s) "
                f"({', '.join(map(str, visible)) or 'none'}); set gpus_per_node: 0 to train on CPU ranks with gloo, "
                "lower it, or submit with --executor slurm"
            )


def visible_gpus() -> tuple[int, ...]:
    """GPU indices this machine offers a local job (``CUDA_VISIBLE_DEVICES`` when set), without torch."""
    declared = os.environ.get("CUDA_VISIBLE_DEVICES")
    if declared is not None:
        entries = [entry.strip() for entry in declared.split(",") if entry.strip()]
        return tuple(int(entry) for entry in entries if entry.isdigit())
    driver = Path("/proc/driver/nvidia/gpus")
    if driver.is_dir():
        return tuple(range(len(list(driver.iterdir()))))
    return ()


# -- SLURM ------------------------------------------------------------------------------------------------------
def slurm_parameters(spec: JobSpec) -> dict[str, Any]:
    """The parameters of ``SlurmExecutor.update_parameters`` (sbatch names) for ``spec``."""
    from submitit.slurm.slurm import _convert_mem

    resources, slurm = spec.resources, spec.slurm
    exports = [f"export {name}={shlex.quote(value)}" for name, value in spec.env.items()]
    parameters: dict[str, Any] = {
        "job_name": spec.name,
        "time": resources.timeout_min,
        "nodes": resources.nodes,
        "ntasks_per_node": resources.tasks_per_node,
        "cpus_per_task": resources.cpus_per_task,
        "mem": _convert_mem(resources.mem_gb),
        "signal_delay_s": slurm.signal_delay_s,
        "setup": [*exports, *slurm.setup],
        # Jobs come back after a preemption or `scontrol requeue`; the job runs in its workdir.
        "additional_parameters": {"requeue": True, "chdir": str(spec.workdir), **slurm.additional},
    }
    if resources.gpus_per_node:
        parameters["gpus_per_node"] = resources.gpus_per_node
    for name in ("partition", "account", "qos", "constraint"):
        if getattr(slurm, name) is not None:
            parameters[name] = getattr(slurm, name)
    return parameters


_SBATCH_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def sbatch_quote(value: str) -> str:
    """``value`` as sbatch reads it back from an ``#SBATCH`` line: bare when plain, else in single quotes
    with backslashes and single quotes escaped by a backslash (sbatch's reader takes a backslash as an
    escape inside quotes too; its values never reach a shell)."""
    if _SBATCH_PLAIN.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _requote_directives(script: str) -> str:
    """submitit's script with each ``#SBATCH --key=value`` requoted by :func:`sbatch_quote`: submitit
    quotes the values for a shell (``shlex.quote``), which sbatch reads differently."""
    lines = script.split("\n")
    for index, line in enumerate(lines):
        if line.strip() and not line.startswith("#"):
            break  # sbatch reads no directive past the first command
        option, equals, quoted = line.partition("=")
        if line.startswith("#SBATCH --") and equals:
            (value,) = shlex.split(quoted)
            lines[index] = f"{option}={sbatch_quote(value)}"
    return "\n".join(lines)


def _submitit_command(folder: Path, python: str) -> str:
    # What SlurmExecutor._submitit_command_str builds: every task runs submitit's entry point.
    return " ".join([python, "-u -m submitit.core._submit", shlex.quote(str(folder))])


def sbatch_script(spec: JobSpec, paths: RunPaths, *, python: str | None = None) -> str:
    """The sbatch script ``SlurmExecutor`` writes for ``spec`` (same function, same parameters),
    built without constructing the executor (which needs ``srun``) and without touching a file."""
    from submitit.slurm.slurm import _make_sbatch_string

    python = shlex.quote(sys.executable) if python is None else python
    folder = Path(os.path.abspath(paths.submitit))
    script = _make_sbatch_string(command=_submitit_command(folder, python), folder=folder, **slurm_parameters(spec))
    return _requote_directives(script)


def _slurm_executor(folder: Path) -> Any:
    """A ``SlurmExecutor`` whose sbatch script is :func:`sbatch_script`'s (directives quoted for sbatch)."""
    from submitit import SlurmExecutor

    class QuotingSlurmExecutor(SlurmExecutor):
        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return _requote_directives(super()._make_submission_file_text(command, uid))

    return QuotingSlurmExecutor(folder=folder)


def _submit_slurm(spec: JobSpec, paths: RunPaths, runtime: Any) -> str:
    try:
        executor = _slurm_executor(paths.submitit)
    except RuntimeError as error:
        raise SubmissionError(f"SLURM is not available here ({error}); submit from a SLURM login node, "
                              "or use --executor local") from None
    executor.update_parameters(**slurm_parameters(spec))
    try:
        job = executor.submit(runtime)
    except Exception as error:  # sbatch's refusal arrives as one of several submitit/subprocess errors
        hint = "" if slurm_configured() else (
            " (no SLURM configuration found: set SLURM_CONF, or use --executor local on a machine without a cluster)")
        raise SubmissionError(f"sbatch refused job {spec.name}{hint}: {str(error).strip()}") from None
    return str(job.job_id)


# -- local ------------------------------------------------------------------------------------------------------
def local_parameters(spec: JobSpec) -> dict[str, Any]:
    """The parameters of ``LocalExecutor.update_parameters`` for ``spec`` (submitit's defaults are
    traps: a 2-minute limit; both the limit and the signal delay are always set)."""
    resources = spec.resources
    parameters: dict[str, Any] = {
        "nodes": 1,
        "tasks_per_node": resources.tasks_per_node,
        "gpus_per_node": resources.gpus_per_node,
        "timeout_min": resources.timeout_min,
        "signal_delay_s": spec.slurm.signal_delay_s,
    }
    declared = os.environ.get("CUDA_VISIBLE_DEVICES")
    if resources.gpus_per_node and declared:
        parameters["visible_gpus"] = visible_gpus()  # submitit would otherwise renumber from 0
    return parameters


def job_environment(spec: JobSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a local job starts with: this process's, without a surrounding job's rank and
    SLURM/submitit variables, plus the spec's ``env``."""
    environment = {
        name: value
        for name, value in (os.environ if base is None else base).items()
        if name not in _JOB_ENV_NAMES and not name.startswith(_JOB_ENV_PREFIXES)
    }
    environment.update(spec.env)
    return environment


def local_plan(spec: JobSpec, paths: RunPaths, *, python: str | None = None) -> str:
    """What ``submit --executor local`` would start, as shell-like text. Touches nothing."""
    python = shlex.quote(sys.executable) if python is None else python
    folder = Path(os.path.abspath(paths.submitit))
    parameters = local_parameters(spec)
    tasks = parameters["tasks_per_node"]
    gpus = parameters["gpus_per_node"]
    devices = ",".join(map(str, parameters.get("visible_gpus", range(gpus))[:gpus]))
    env = " ".join(f"{name}={shlex.quote(value)}" for name, value in spec.env.items())
    log = shlex.quote(str(paths.controller_log))
    task_log = shlex.quote(str(folder / "JOBID_RANK_log"))
    lines = [
        f"# local executor: one controller on this machine starts {tasks} task(s) "
        + (f"(ranks 0-{tasks - 1}, " if tasks > 1 else "(rank 0, ")
        + (f"one GPU each: CUDA_VISIBLE_DEVICES={devices})" if gpus else "CPU, gloo)"),
        f"# and starts them again when they exit for a requeue. Limit {parameters['timeout_min']} min per start; "
        f"{requeue_signal().name} {parameters['signal_delay_s']} s before it.",
        "# The controller runs in its own session; JOBID is its process id.",
        f"cd {shlex.quote(str(spec.workdir))}",
        " ".join(part for part in (
            "setsid env", env, f"CUDA_VISIBLE_DEVICES={devices}",
            f"{python} -m submitit.local._local {shlex.quote(str(folder))}",
            f"< /dev/null >> {log} 2>&1 &",
        ) if part),
        "# each task (its stdout and stderr in RUN_DIR/submitit/JOBID_RANK_log.out and .err):",
        f"{_submitit_command(folder, python)} >> {task_log}.out 2>> {task_log}.err",
        f"# the callable it runs: elfes.launcher.runtime.JobRuntime({str(paths.run_dir)!r})",
        "",
    ]
    return "\n".join(lines)


def _reset_signals() -> None:
    # A rank that resubmits has flag-only handlers and may ignore signals; the controller (exec'd, so
    # handlers reset) would still inherit an ignored disposition.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT):
        signal.signal(signum, signal.SIG_DFL)


def _submit_local(spec: JobSpec, paths: RunPaths, runtime: Any) -> str:
    """Submit through ``LocalExecutor`` from a forked child in a new session whose standard streams
    are the controller log; the controller outlives the child (and this process)."""
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
            from submitit import LocalExecutor

            executor = LocalExecutor(folder=paths.submitit)
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
                              f"{reply.get('error', 'no reply from the submitting child')}; see {paths.controller_log}")
    return reply["job_id"]


# -- the verbs' entry points ----------------------------------------------------------------------------------
def dry_run(spec: JobSpec, paths: RunPaths, executor: str) -> str:
    """The sbatch script (``slurm``) or the local command (``local``) a submission would use."""
    check_executor(spec, executor)
    if executor == "slurm":
        return sbatch_script(spec, paths)
    return local_plan(spec, paths)


def submit(spec: JobSpec, paths: RunPaths, executor: str) -> str:
    """Submit ``JobRuntime(run_dir)`` for ``spec`` on ``executor`` ("slurm" or "local"); return the job id.

    Callers: ``elfes submit``/``resume`` (launcher/submission.py) and a local job's rank 0 resubmitting past
    submitit's six starts. The run directory must hold the recorded spec and state already.
    Raises :class:`ExecutorError` (spec unfit for the executor) or :class:`SubmissionError`.
    """
    check_executor(spec, executor)
    from .runtime import JobRuntime  # lazily: written by the in-job side; torch-free at import

    runtime = JobRuntime(str(paths.run_dir))
    if executor == "slurm":
        return _submit_slurm(spec, paths, runtime)
    if executor == "local":
        return _submit_local(spec, paths, runtime)
    raise ExecutorError(f"executor {executor!r} is unknown; use slurm or local")
