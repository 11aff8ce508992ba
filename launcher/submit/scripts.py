"""What a submission says: the sbatch script and its parameters (directives quoted the way sbatch
reads them), the local executor's parameters, environment and command. Pure text and mappings; it starts
nothing. Torch-free.

>>> print(sbatch_script(spec, RunPaths(spec.run_dir)))     # what `elfes submit --dry-run` shows  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from ..rundir.liveness import LOCAL_CONTROLLER_MODULE
from ..rundir.paths import RunPaths
from ..spec.models import JobSpec
from ..spec.sections import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES

# Variables of a surrounding job that must not leak into a job this process submits (a local job's
# rank 0 resubmits past submitit's start limit from inside the job).
JOB_ENV_NAMES = RESERVED_ENV_NAMES | {"GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE"}
JOB_ENV_PREFIXES = (*RESERVED_ENV_PREFIXES, "TORCHELASTIC_")


def slurm_parameters(spec: JobSpec, *, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The parameters of ``SlurmExecutor.update_parameters`` (sbatch names) for ``spec``; ``exclude``: nodes to
    leave out (``--exclude``: the run's exclusions after failures, from state.json)."""
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
    if exclude:
        parameters["exclude"] = ",".join(exclude)
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


def requote_directives(script: str) -> str:
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


def submitit_command(folder: Path, python: str) -> str:
    # What SlurmExecutor._submitit_command_str builds: every task runs submitit's entry point.
    return " ".join([python, "-u -m submitit.core._submit", shlex.quote(str(folder))])


def sbatch_script(spec: JobSpec, paths: RunPaths, *, python: str | None = None, exclude: tuple[str, ...] = ()) -> str:
    """The sbatch script ``SlurmExecutor`` writes for ``spec`` (same function, same parameters; ``exclude``: as
    :func:`slurm_parameters`), built without constructing the executor (which needs ``srun``) and without
    touching a file."""
    from submitit.slurm.slurm import _make_sbatch_string

    python = shlex.quote(sys.executable) if python is None else python
    folder = Path(os.path.abspath(paths.submitit))
    script = _make_sbatch_string(command=submitit_command(folder, python), folder=folder,
                                 **slurm_parameters(spec, exclude=exclude))
    return requote_directives(script)


def slurm_executor(folder: Path) -> Any:
    """A ``SlurmExecutor`` whose sbatch script is :func:`sbatch_script`'s (directives quoted for sbatch)."""
    from submitit import SlurmExecutor

    class QuotingSlurmExecutor(SlurmExecutor):
        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return requote_directives(super()._make_submission_file_text(command, uid))

    return QuotingSlurmExecutor(folder=folder)


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
        if name not in JOB_ENV_NAMES and not name.startswith(JOB_ENV_PREFIXES)
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
            f"{python} -m {LOCAL_CONTROLLER_MODULE} {shlex.quote(str(folder))}",
            f"< /dev/null >> {log} 2>&1 &",
        ) if part),
        "# each task (its stdout and stderr in RUN_DIR/submitit/JOBID_RANK_log.out and .err):",
        f"{submitit_command(folder, python)} >> {task_log}.out 2>> {task_log}.err",
        f"# the callable it runs: elfes.launcher.job.runtime.JobRuntime({str(paths.run_dir)!r})",
        "",
    ]
    return "\n".join(lines)


def requeue_signal() -> signal.Signals:
    """The signal that asks a job to save and requeue: submitit's (SIGUSR2 unless
    ``SUBMITIT_PREEMPT_SIGNAL`` names another), the one in ``--signal=USR2@N``."""
    from submitit.core.job_environment import JobEnvironment

    return signal.Signals(JobEnvironment._usr_sig())


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
