"""The login-node commands against a real (private) SLURM cluster: `elfes submit --dry-run`'s script is
one sbatch accepts; `elfes submit` queues the job, `elfes status` adds SLURM's queue state, `elfes
preempt` (scancel --signal=USR2) makes the job save and requeue itself, `elfes cancel` (a marker, then
scancel) ends it cancelled. A small `command:` job: no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cluster import SlurmCluster, wait_for

ELFES = str(Path(sys.executable).with_name("elfes"))
REPOSITORY = Path(__file__).resolve().parents[2]

WAITING = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))\n"
    "signal.signal(signal.SIGUSR2, lambda *_: sys.exit(128 + signal.SIGUSR2))\n"
    "print('waiting', flush=True)\n"
    "time.sleep(600)\n"
)


def write_spec(folder: Path, **resources: object) -> Path:
    spec = folder / "job.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "elfes-on-slurm",
                "command": ["{python}", "-c", WAITING],
                "run_dir": "run",
                "resources": {"tasks_per_node": 1, "timeout_min": 10, "mem_gb": 0.5, **resources},
                "slurm": {"partition": "low", "signal_delay_s": 60},
                "requeue": {"max_requeues": 2},
                "env": {"PYTHONPATH": str(REPOSITORY)},
            }
        )
    )
    return spec


def elfes(slurm: SlurmCluster, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([ELFES, *argv], cwd=cwd, env=slurm.env, capture_output=True, text=True, timeout=120)


def status(slurm: SlurmCluster, run_dir: Path) -> dict:
    completed = elfes(slurm, "status", str(run_dir), "--json", cwd=run_dir.parent)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_the_dry_run_script_is_accepted_by_sbatch(slurm: SlurmCluster, tmp_path: Path):
    dry_run = elfes(slurm, "submit", str(write_spec(tmp_path, cpus_per_task=2)), "--dry-run", cwd=tmp_path)
    assert dry_run.returncode == 0, dry_run.stderr
    assert "#SBATCH --partition=low" in dry_run.stdout and not (tmp_path / "run").exists()
    script = tmp_path / "job.sbatch"
    script.write_text(dry_run.stdout)
    tested = slurm.run("sbatch", "--test-only", str(script), check=False)
    assert tested.returncode == 0, tested.stderr


def test_submit_status_preempt_requeue_and_cancel(slurm: SlurmCluster, tmp_path: Path):
    run_dir = tmp_path / "run"
    submitted = elfes(slurm, "submit", str(write_spec(tmp_path)), cwd=tmp_path)  # auto: SLURM_CONF is set
    assert submitted.returncode == 0 and "as slurm job" in submitted.stdout, submitted.stderr
    wait_for(lambda: status(slurm, run_dir)["status"] == "running", timeout_s=60, what="attempt 1 running")
    assert status(slurm, run_dir)["queue_state"] == "RUNNING"

    preempted = elfes(slurm, "preempt", str(run_dir), cwd=tmp_path)
    assert preempted.returncode == 0 and "sent SIGUSR2 to SLURM job" in preempted.stdout, preempted.stderr
    wait_for(
        lambda: len(status(slurm, run_dir)["attempts"]) == 2 and status(slurm, run_dir)["status"] == "running",
        timeout_s=90,
        what="attempt 2 (SLURM's relaunch after `scontrol requeue`) running",
    )
    report = status(slurm, run_dir)
    assert [(a["outcome"], a["signal"]) for a in report["attempts"]] == [("requeued", "SIGUSR2"), (None, None)]
    assert report["attempts"][1]["launch"] == "requeue" and report["requeues_used"] == 1

    cancelled = elfes(slurm, "cancel", str(run_dir), cwd=tmp_path)
    assert cancelled.returncode == 0 and "(scancel)" in cancelled.stdout, cancelled.stderr
    wait_for(lambda: status(slurm, run_dir)["status"] == "cancelled", timeout_s=60, what="the run cancelled")
    assert status(slurm, run_dir)["attempts"][-1]["signal"] == "SIGTERM"
    logs = elfes(slurm, "logs", str(run_dir), cwd=tmp_path)
    assert logs.returncode == 0 and "waiting" in logs.stdout
