"""Real multi-process launches for tests: the environment of a child process and torchrun on gloo ranks.

A plain module (not a conftest.py), so that any test module imports it by name: tests/slurm and
tests/launcher have conftest.py files too, and whichever pytest imported last would own the name
"conftest"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
GUARDED_ENVIRONMENT_PREFIXES = ("SLURM_", "MASTER_", "ACCELERATE_", "TORCHELASTIC_")
GUARDED_ENVIRONMENT_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def interpreter_first_on_path(path: str | None) -> str:
    """``path`` with the folder of this interpreter first: a command's ``torchrun``, ``elfes`` and ``python``
    are this environment's, also when it was not activated (`make test` runs .venv/bin/python)."""
    return os.pathsep.join([str(Path(sys.executable).parent), path if path is not None else os.defpath])


def launch_environment(**extra: str) -> dict[str, str]:
    """The environment of a child process: this interpreter's folder first on PATH, CPU collectives (gloo),
    one thread, the repo importable, no COLUMNS (piped tables keep their width, whatever the terminal's)."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not (name.startswith(GUARDED_ENVIRONMENT_PREFIXES) or name in GUARDED_ENVIRONMENT_NAMES)
    }
    environment.pop("COLUMNS", None)
    python_path = [str(REPOSITORY / "tests" / "engine"), str(REPOSITORY)]
    if environment.get("PYTHONPATH"):
        python_path.append(environment["PYTHONPATH"])
    environment.update(
        ACCELERATE_USE_CPU="1",  # without it Accelerate on a CPU machine silently trains each rank alone
        OMP_NUM_THREADS="1",
        PATH=interpreter_first_on_path(environment.get("PATH")),
        PYTHONPATH=os.pathsep.join(python_path),
    )
    environment.update(extra)
    return environment


def launch_torchrun(script: Path, *arguments: str, processes: int = 2, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Run ``script`` on ``processes`` gloo ranks with torchrun; the return code is None if it timed out."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
        str(script), *arguments,
    ]
    process = subprocess.Popen(
        command, env=launch_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPOSITORY
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # SIGTERM, not subprocess.run's SIGKILL: torchrun then kills each rank's process group (ranks run
        # in sessions of their own, with their DataLoader workers), which would otherwise outlive the test.
        process.terminate()
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        return subprocess.CompletedProcess(command, None, stdout, stderr)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def torchrun(script: Path, *arguments: str, processes: int = 2, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Run ``script`` on ``processes`` gloo ranks with torchrun; fail the test with its output if it fails."""
    launch = launch_torchrun(script, *arguments, processes=processes, timeout_s=timeout_s)
    if launch.returncode != 0:
        outcome = f"did not finish within {timeout_s} s" if launch.returncode is None else f"exited with {launch.returncode}"
        pytest.fail(
            f"torchrun {script.name} {' '.join(arguments)} {outcome}\n"
            f"--- stdout ---\n{launch.stdout[-6000:]}\n--- stderr ---\n{launch.stderr[-6000:]}"
        )
    return launch


def kill_local_run(run_dir: Path) -> None:
    """SIGKILL what is left of a local run (its submitit controller and task processes): a test's teardown."""
    from elfes.launcher.rundir.liveness import local_processes
    from elfes.launcher.rundir.paths import RunPaths

    processes = local_processes(RunPaths(run_dir))
    for pid in processes["controller"] + processes["task"]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
