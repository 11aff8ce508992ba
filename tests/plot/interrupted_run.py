"""A real interrupted run for the plot and TensorBoard tests, through `elfes submit --executor local`.

The quickstart job (one rank, 3 epochs of 8 optimizer steps, a train record every step, the
TensorBoard mirror on through the spec's ``env:``) is preempted twice with `elfes preempt` (SIGUSR2:
the job saves `last` and relaunches itself), then its third attempt's task is SIGKILLed once it has
logged train records two steps past its start, and `elfes resume` finishes the run. Every wait is on
what the job writes (events.jsonl, state.json, pid files), never a bare sleep.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from launching import kill_local_run

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.liveness import local_processes
from elfes.launcher.rundir.paths import RunPaths

REPOSITORY = Path(__file__).resolve().parents[2]
PLANNED_STEPS = 24  # 256 samples, batches of 16, accumulation 2: 8 steps per epoch, 3 epochs
# Seconds of sleep per batch: attempt 3 is slow, so that the kill lands long before its next checkpoint.
STEP_DELAY_S = {"default": 0.03, "3": 0.4}
TIMEOUT_S = 150.0


@dataclass(frozen=True)
class InterruptedRun:
    run_dir: Path
    killed_at_step: int  # the last step attempt 3 logged before the kill


def diagnostics(run_dir: Path) -> str:
    paths = RunPaths(run_dir)
    parts = [f"--- {paths.state} ---", paths.state.read_text() if paths.state.exists() else "(none)"]
    for file in sorted(paths.logs.glob("attempt-*/rank-*.*")) + [paths.controller_log]:
        if file.is_file():
            parts += [f"--- {file} (tail) ---", file.read_text(errors="replace")[-2000:]]
    return "\n".join(parts)


def wait_for(condition: Callable[[], Any], what: str, run_dir: Path) -> Any:
    deadline = time.monotonic() + TIMEOUT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {TIMEOUT_S:.0f} s waiting for {what}\n{diagnostics(run_dir)}")
        time.sleep(0.02)  # the polling interval of the condition, not a stand-in for it
    return value


def events(run_dir: Path) -> list[dict[str, Any]]:
    file = RunPaths(run_dir).events
    found = []
    for line in file.read_text().splitlines() if file.exists() else ():
        try:
            found.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return found


def attempt_events(run_dir: Path, attempt: int) -> list[dict[str, Any]]:
    """The events of the ``attempt``-th start (started or resumed) of the training loop."""
    starts, found = 0, []
    for event in events(run_dir):
        starts += event["event"] in ("started", "resumed")
        if starts == attempt:
            found.append(event)
    return found


def trained_past(run_dir: Path, attempt: int, steps: int) -> int | None:
    """The last train step of ``attempt`` once it is ``steps`` or more past the attempt's start, else None."""
    found = attempt_events(run_dir, attempt)
    train = [event["step"] for event in found if event["event"] == "train"]
    if not train or train[-1] < found[0]["state"]["step"] + steps:
        return None
    return train[-1]


def run_state_of(run_dir: Path) -> run_state.RunState | None:
    return run_state.load_state(RunPaths(run_dir))


def job_gone(run_dir: Path) -> bool:
    processes = local_processes(RunPaths(run_dir))
    return not processes["controller"] and not processes["task"]


def ended(run_dir: Path) -> run_state.RunState | None:
    """The run's state once it ended and no process of its job is left, else None."""
    state = run_state_of(run_dir)
    return state if state is not None and state.status in run_state.ENDED and job_gone(run_dir) else None


def write_spec(folder: Path, name: str, *, step_delay_s: dict[str, float] = STEP_DELAY_S,
               tracking: dict[str, Any] | None = None) -> Path:
    spec: dict[str, Any] = {
        "name": name,
        "entrypoint": "tests.plot.paced_job:paced_quickstart",
        "workdir": str(REPOSITORY),
        "run_dir": str(folder / name),
        "config": {"epochs": 3, "train_samples": 256, "log_every": 1, "step_delay_s": step_delay_s},
        "resources": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1,
                      "timeout_min": 10},
        "requeue": {"max_requeues": 5},
        "env": {"OMP_NUM_THREADS": "1", "ELFES_TENSORBOARD": "1"},
    }
    if tracking is not None:
        spec["tracking"] = tracking
        spec["env"]["ELFES_TRACKER_FLUSH_TIMEOUT_S"] = "300"  # W&B's service starts slowly on a loaded machine
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_interrupted_job(folder: Path, name: str = "interrupted") -> InterruptedRun:
    """Submit, preempt twice, SIGKILL the third attempt past its last checkpoint, resume to the end."""
    run_dir = folder / name
    assert elfes(["submit", str(write_spec(folder, name)), "--executor", "local"]) == 0
    try:
        wait_for(lambda: trained_past(run_dir, 1, 2), "attempt 1 to train 2 steps", run_dir)
        assert elfes(["preempt", str(run_dir)]) == 0
        # Attempt 2 crosses the end of epoch 1 (evaluation and checkpoint at step 8) before its stop.
        wait_for(lambda: (step := trained_past(run_dir, 2, 2)) and step >= 10, "attempt 2 to pass step 10", run_dir)
        assert elfes(["preempt", str(run_dir)]) == 0
        wait_for(lambda: trained_past(run_dir, 3, 2), "attempt 3 to train 2 steps", run_dir)
        pid = json.loads(RunPaths(run_dir).pid_file(0).read_text())["pid"]
        os.kill(pid, signal.SIGKILL)  # no stop, no checkpoint: its steps past `last` are lost
        # Nothing records the end of a killed job: the next `elfes status` or `elfes resume` finds it gone.
        wait_for(lambda: job_gone(run_dir), "the killed job's processes to be gone", run_dir)
        killed_at = max(event["step"] for event in attempt_events(run_dir, 3) if event["event"] == "train")
        assert elfes(["resume", str(run_dir)]) == 0
        state = wait_for(lambda: ended(run_dir), "the resumed run to end", run_dir)
        assert state.status == "finished", diagnostics(run_dir)
    finally:
        kill_local_run(run_dir)
    return InterruptedRun(run_dir=run_dir, killed_at_step=killed_at)
