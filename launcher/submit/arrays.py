"""Sweeps on SLURM: one job array for many run directories, task k running member k. Torch-free."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..rundir.paths import SweepPaths
from ..spec import JobSpec
from .executors import SubmissionError, submitit_files_undone_on_failure
from .scripts import requote_directives, slurm_executor, slurm_parameters, submitit_command


def array_sbatch_script(spec: JobSpec, folder: Path, count: int, max_parallel: int, *, python: str | None = None,
                        exclude: tuple[str, ...] = ()) -> str:
    """The sbatch script of a job array of ``count`` tasks (``--array=0-<count-1>%<max_parallel>``), each
    running one member's ``JobRuntime``; ``spec``: any member (they share their sbatch options); ``exclude``:
    nodes the array leaves out (``--exclude``; :func:`submit_array`)."""
    from submitit.slurm.slurm import _make_sbatch_string

    python = shlex.quote(sys.executable) if python is None else python
    folder = Path(os.path.abspath(folder))
    script = _make_sbatch_string(command=submitit_command(folder, python), folder=folder, map_count=count,
                                 array_parallelism=max_parallel, **slurm_parameters(spec, exclude=exclude))
    return requote_directives(script)


def submit_array(spec: JobSpec, tasks: list[Any], paths: SweepPaths, max_parallel: int,
                 after: Sequence[str] = (), exclude: tuple[str, ...] = ()) -> list[str]:
    """Submit one SLURM job array (submitit's batch submission, in the sweep's submitit folder) whose task k
    runs ``tasks[k]`` (a member's ``JobRuntime``); returns each task's job id (``<array>_<k>``; a plain id for
    one member). ``spec``: any member; ``after``: jobs it waits for (``--dependency=afterany:...``);
    ``exclude``: nodes it leaves out (``--exclude``: its members' exclusions after failures). What submitit
    wrote is removed when sbatch refuses."""
    try:
        executor = slurm_executor(paths.submitit)
    except RuntimeError as error:
        raise SubmissionError(f"SLURM is not available here ({error}); submit from a SLURM login node, "
                              "or use --executor local") from None
    executor.update_parameters(**slurm_parameters(spec, exclude=exclude), array_parallelism=max_parallel)
    if after:
        executor.update_parameters(dependency="afterany:" + ":".join(after))
    try:
        with submitit_files_undone_on_failure(paths), executor.batch():
            jobs = [executor.submit(task) for task in tasks]
    except Exception as error:  # sbatch's refusal arrives as one of several submitit/subprocess errors
        hint = (f" (it leaves out {', '.join(exclude)} after its members' failures there, "
                "requeue.exclude_failed_nodes: `elfes resume SWEEP_DIR --include-nodes` allows them again)"
                if exclude else "")
        raise SubmissionError(f"sbatch refused the job array of {spec.name}{hint}: {str(error).strip()}") from None
    return [str(job.job_id) for job in jobs]
