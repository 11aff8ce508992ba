"""Hand-built run directories for the login-node tests: a recorded spec, state.json written through
launcher/rundir/state.py's transitions, a few run records and log files. No job runs."""

from __future__ import annotations

import json
from pathlib import Path

from elfes.files import write_text_atomically
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.spec import load_spec

SPEC = """\
name: {name}
entrypoint: train:main
workdir: .
run_dir: runs/{name}
config: {{epochs: 1}}
resources: {{tasks_per_node: 2, timeout_min: 10}}
slurm: {{signal_delay_s: 60}}
requeue: {{max_requeues: 3}}
"""

# A pid far above any kernel's pid_max: no process has it.
GONE_JOB_ID = "4194999"


def write_project(folder: Path, name: str = "demo") -> Path:
    """A spec file and its entrypoint module in ``folder``; returns the spec file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text("def main(job):\n    return None\n")
    spec = folder / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name))
    return spec


def events(step: int, planned: int) -> list[dict]:
    time = "2026-01-02T03:04:05.000000+00:00"
    state = {"epoch": 0, "next_batch": 0, "step": 0, "batches": 0, "samples": 0, "best_metric": None,
             "best_step": None, "evaluations_without_improvement": 0, "stop_reason": None}
    budget = {"epochs": 1, "max_steps": None, "planned_steps": planned, "updates_per_epoch": planned,
              "batches_per_epoch": planned}
    return [
        {"event": "started", "time": time, "world_size": 2, "precision": "no", "device": "cpu",
         "gradient_accumulation_steps": 1, "config": {}, "budget": budget, "optimizer": {}, "ema_decay": None,
         "objective": None, "metadata": {}, "state": state},
        {"event": "train", "time": time, "epoch": 1, "step": step, "planned_steps": planned, "samples": 8 * step,
         "metrics": {"loss": 0.25}},
        {"event": "evaluation", "time": time, "epoch": 1, "step": step, "weights": "raw",
         "metrics": {"validation": {"loss": 0.5}}, "duration_s": 0.1, "monitor": "validation/loss", "improved": True,
         "best_metric": 0.5, "best_step": step},
    ]


def make_run(folder: Path, *, name: str = "demo", outcome: str | None = "stopped", step: int = 4,
             job_id: str = GONE_JOB_ID, executor: str = "local") -> RunPaths:
    """A run directory whose single attempt ended with ``outcome`` (None: still running)."""
    spec = load_spec(write_project(folder, name))
    paths = RunPaths(spec.run_dir)
    paths.run_dir.mkdir(parents=True)
    write_text_atomically(paths.spec, spec.to_yaml())
    token = f"{job_id}:0"
    run_state.update_state(paths, lambda s: run_state.record_submission(
        s, executor=executor, kind="submit", max_requeues=spec.requeue.max_requeues, run_dir=str(paths.run_dir)))
    run_state.update_state(paths, lambda s: run_state.mark_pending(s, job_id=job_id))
    run_state.update_state(paths, lambda s: run_state.begin_attempt(
        s, token=token, job_id=job_id, launch="submit", hosts=["node-a"], world_size=2))
    if outcome is not None:
        run_state.update_state(paths, lambda s: run_state.end_attempt(
            s, token=token, outcome=outcome, signal="SIGTERM" if outcome in ("stopped", "cancelled") else None,
            step=step, error="RuntimeError: boom" if outcome == "failed" else None))
    paths.events.write_text("".join(json.dumps(event) + "\n" for event in events(step, 10)))
    for rank in (0, 1):
        paths.attempt_logs(1).mkdir(parents=True, exist_ok=True)
        paths.rank_log(1, rank, "out").write_text(f"hello from rank {rank}\n")
        paths.rank_log(1, rank, "err").write_text(f"warning from rank {rank}\n")
    return paths
