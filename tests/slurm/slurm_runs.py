"""What the SLURM end-to-end tests share: the job spec they submit (the quickstart model, slowed in its first
attempt so that a signal lands mid-run), the `elfes` CLI run against a cluster, and waits on a run's state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cluster import SlurmCluster
from run_comparison import assert_runs_bitwise_equal

from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths
from tests.launcher.entrypoints import TINY_CHARLM

ELFES = str(Path(sys.executable).with_name("elfes"))
REPOSITORY = Path(__file__).resolve().parents[2]
# 256 samples in batches of 16, accumulation 2: 16 optimizer steps on one rank, 8 on two.
CONFIG = {"epochs": 2, "train_samples": 256, "log_every": 1}
PLANNED_STEPS = 16
STEP_DELAY_S = 0.4  # per batch, in the first attempt only: ~13 s of training, so that a preemption lands mid-run
RUN_TIMEOUT_S = 240.0  # torch imports and SLURM's relaunch delays on 2 loaded cores


# -- specs, runs, waiting -----------------------------------------------------------------------------------------
# examples/charlm, tiny, its model sharded over the ranks with FSDP2 (checkpoints: folders of every rank's shards),
# slowed in the first attempt like the quickstart.
SHARDED_CHARLM = {"entrypoint": "tests.launcher.entrypoints:sharded_charlm", "config": TINY_CHARLM}


def write_spec(folder: Path, name: str, *, tasks: int = 1, nodes: int = 1, cpus_per_task: int = 1,
               step_delay_s: float = STEP_DELAY_S, timeout_min: int = 10, signal_delay_s: int = 60, max_requeues: int = 3,
               entrypoint: str = "tests.slurm.slurm_jobs:first_attempts_slow", config: dict[str, Any] = CONFIG) -> Path:
    spec = folder / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "entrypoint": entrypoint, "workdir": str(REPOSITORY),
        "run_dir": str(folder / name), "config": {**config, "step_delay_s": step_delay_s, "slow_attempts": 1},
        "resources": {"nodes": nodes, "tasks_per_node": tasks, "gpus_per_node": 0, "cpus_per_task": cpus_per_task,
                      "mem_gb": 1, "timeout_min": timeout_min},
        "slurm": {"partition": "low", "signal_delay_s": signal_delay_s}, "requeue": {"max_requeues": max_requeues},
        "env": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)},
    }))
    return spec


def elfes(cluster: SlurmCluster | None, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the `elfes` CLI (with the cluster's SLURM_CONF; without a cluster, none)."""
    environment = cluster.env if cluster is not None else {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    completed = subprocess.run([ELFES, *argv], env=environment, capture_output=True, text=True, timeout=180)
    if check:
        assert completed.returncode == 0, f"elfes {' '.join(argv)} exited {completed.returncode}: {completed.stderr}"
    return completed


def submit(cluster: SlurmCluster, folder: Path, name: str, **spec: Any) -> Path:
    submitted = elfes(cluster, "submit", str(write_spec(folder, name, **spec)), "--executor", "slurm")
    assert "as slurm job" in submitted.stdout
    return folder / name


def status(cluster: SlurmCluster, run_dir: Path) -> dict[str, Any]:
    return json.loads(elfes(cluster, "status", str(run_dir), "--json").stdout)


def state_of(run_dir: Path) -> run_state.RunState | None:
    return run_state.load_state(RunPaths(run_dir))


def diagnostics(run_dir: Path) -> str:
    paths = RunPaths(run_dir)
    files = [paths.state, *sorted(paths.logs.glob("attempt-*/rank-*.*")), *sorted(paths.submitit.glob("*_log.*"))]
    return "\n".join(f"--- {file} (tail) ---\n{file.read_text(errors='replace')[-2500:]}" for file in files
                     if file.is_file())


def wait_run(run_dir: Path, condition: Callable[[], Any], what: str, timeout_s: float = RUN_TIMEOUT_S) -> Any:
    """Poll ``condition``; fail with the run's files after ``timeout_s``, or at once when the run failed."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        state = state_of(run_dir)
        if (state is not None and state.status == "failed") or time.monotonic() > deadline:
            pytest.fail(f"waiting for {what}: the run is {state.status if state else 'not started'}\n"
                        f"{diagnostics(run_dir)}")
        time.sleep(0.2)
    return value


def wait_ended(run_dir: Path, expected: str, timeout_s: float = RUN_TIMEOUT_S) -> run_state.RunState:
    state = wait_run(run_dir, lambda: (s := state_of(run_dir)) is not None and s.status in run_state.ENDED and s,
                     f"the run to end {expected}", timeout_s)
    assert state.status == expected, diagnostics(run_dir)
    return state


def events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        lines = RunPaths(run_dir).events.read_text().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return found


def training_from(run_dir: Path, step: int, attempt: int = 1) -> bool:
    """Whether ``attempt`` runs (its rank 0 recorded its pid) and the run logged a train record at ``step``."""
    try:
        task = json.loads(RunPaths(run_dir).pid_file(0).read_text())
    except (FileNotFoundError, ValueError):
        return False
    return task.get("attempt") == attempt and any(
        event["event"] == "train" and event.get("step", -1) >= step for event in events(run_dir))


def outcomes(state: run_state.RunState) -> list[tuple[str | None, str | None, str]]:
    return [(attempt.outcome, attempt.signal, attempt.launch) for attempt in state.attempts]


def queue(cluster: SlurmCluster, job_id: str) -> str:
    """squeue's ``STATE|REASON`` of the job ("" once it left the queue)."""
    return cluster.run("squeue", "-h", "-j", job_id, "-o", "%T|%r", check=False).stdout.strip()


def accounted(cluster: SlurmCluster, job_id: str) -> str:
    """sacct's state of the job ("COMPLETED", "CANCELLED", ...; "" while unknown)."""
    lines = cluster.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id, check=False).stdout.split()
    return lines[0] if lines else ""


# sacct's states of a job that has not ended (yet, or again: a requeued job is PENDING, then RUNNING).
UNENDED_STATES = frozenset({"", "PENDING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                            "SUSPENDED", "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT"})


def final_accounted(cluster: SlurmCluster, job_id: str) -> str:
    """sacct's state of the job once it has ended ("COMPLETED", "TIMEOUT", ...); "" while it has not."""
    state = accounted(cluster, job_id)
    return "" if state in UNENDED_STATES else state


def preempt_with_a_high_job(cluster: SlurmCluster, folder: Path) -> str:
    """Submit a one-CPU job to `high`, which needs a CPU that the `low` job holds; returns its id."""
    return cluster.run("sbatch", "--parsable", "--partition=high", "--ntasks=1", "--cpus-per-task=1", "--mem=100M",
                       f"--output={folder / 'preemptor.out'}", "--wrap", "echo preemptor ran", cwd=folder
                       ).stdout.strip()


def started_at(attempt: run_state.Attempt) -> float:
    return datetime.fromisoformat(attempt.started_at).timestamp()


def ended_at(attempt: run_state.Attempt) -> float:
    return datetime.fromisoformat(str(attempt.ended_at)).timestamp()


def submitit_starts(run_dir: Path, job_id: str) -> int:
    """How many starts submitit logged in rank 0's own log (SLURM's ``%j_%t_log.out``) of the job."""
    log = RunPaths(run_dir).submitit / f"{job_id}_0_log.out"
    return log.read_text().count("Starting with JobEnvironment") if log.exists() else 0


def assert_bitwise_equal_to(run_dir: Path, reference: Path, tasks: int) -> None:
    """The reference finished its planned steps, and ``run_dir`` ended bitwise equal to it."""
    assert wait_ended(reference, "finished").attempts[-1].step == PLANNED_STEPS // tasks
    assert_runs_bitwise_equal(run_dir, reference)
