"""Real jobs on the local executor for the launcher's end-to-end tests: writing a spec and submitting it
through the CLI (:class:`Runs`, which ends what is left at teardown), then waiting on what the job writes
(state.json, pid files, events.jsonl), never on bare sleeps.

Shared by the test modules of this folder; the ``runs`` and ``references`` fixtures (conftest.py) yield
:class:`Runs`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from launching import kill_local_run

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths

REPOSITORY = Path(__file__).resolve().parents[2]
# 256 samples, batches of 16, accumulation 2: 8 optimizer steps per epoch on one rank, 16 in all (8 on two
# ranks); a train record every step.
CONFIG = {"epochs": 2, "train_samples": 256, "log_every": 1}
PLANNED_STEPS = 16
STEP_DELAY_S = 0.08  # per batch and rank (times the ranks): about 2.6 s of training, so signals land mid-run
JOB_TIMEOUT_S = 300.0  # a loaded machine; an attempt with a tracker may wait up to 120 s for its mirror to start


# -- specs and runs ---------------------------------------------------------------------------------------------
def write_spec(folder: Path, name: str, *, tasks: int = 1, max_requeues: int = 5, **fields: Any) -> Path:
    """A job spec in ``folder`` whose run directory is ``folder/name``; ``fields`` override the defaults."""
    spec: dict[str, Any] = {
        "name": name,
        "entrypoint": "tests.launcher.entrypoints:slow_quickstart",
        "workdir": str(REPOSITORY),
        "run_dir": str(folder / name),
        "config": {**CONFIG, "step_delay_s": STEP_DELAY_S * tasks},
        "resources": {"nodes": 1, "tasks_per_node": tasks, "gpus_per_node": 0, "cpus_per_task": 1,
                      "mem_gb": 1, "timeout_min": 10},
        "slurm": {"signal_delay_s": 60},
        "requeue": {"max_requeues": max_requeues},
        "env": {"OMP_NUM_THREADS": "1"},
    }
    spec.update(fields)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class Runs:
    """Submits runs through the CLI and, at teardown, ends whatever of them is still alive."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.run_dirs: list[Path] = []

    def submit(self, name: str, **spec_fields: Any) -> Path:
        spec = write_spec(self.folder, name, **spec_fields)
        run_dir = self.folder / name
        self.run_dirs.append(run_dir)
        assert elfes(["submit", str(spec), "--executor", "local"]) == 0
        return run_dir

    def kill_leftovers(self) -> None:
        for run_dir in self.run_dirs:
            kill_local_run(run_dir)


# -- waiting on what the job writes -----------------------------------------------------------------------------
def diagnostics(run_dir: Path) -> str:
    paths = RunPaths(run_dir)
    parts = [f"--- {paths.state} ---", paths.state.read_text() if paths.state.exists() else "(none)"]
    files = sorted(paths.logs.glob("attempt-*/rank-*.*")) + sorted(paths.submitit.glob("*_log.*"))
    for file in [*files, paths.controller_log]:
        if file.is_file():
            parts += [f"--- {file} (tail) ---", file.read_text(errors="replace")[-3000:]]
    return "\n".join(parts)


def wait_for(
    condition: Callable[[], Any], *, what: str, run_dir: Path, timeout_s: float = JOB_TIMEOUT_S, may_end: bool = False
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with the run's files after ``timeout_s``,
    or at once when the run ended meanwhile (unless ``may_end``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        state = None if may_end else state_of(run_dir)
        if state is not None and state.status in run_state.ENDED and not condition():
            pytest.fail(f"the run ended {state.status} ({state.error}) while waiting for {what}\n{diagnostics(run_dir)}")
        if time.monotonic() > deadline:
            processes = ""
            if RunPaths(run_dir).run_dir.is_dir():
                from elfes.launcher.rundir.liveness import local_processes

                processes = f"live processes of the run: {local_processes(RunPaths(run_dir))}\n"
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}\n{processes}{diagnostics(run_dir)}")
        time.sleep(0.05)


def state_of(run_dir: Path) -> run_state.RunState | None:
    return run_state.load_state(RunPaths(run_dir))


def events(run_dir: Path) -> list[dict[str, Any]]:
    file = RunPaths(run_dir).events
    if not file.exists():
        return []
    found = []
    for line in file.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return found


def trained_to(run_dir: Path, step: int) -> bool:
    """Whether the run logged a train record at ``step`` or later (in any attempt)."""
    return any(event.get("event") == "train" and event.get("step", -1) >= step for event in events(run_dir))


def tasks_running(run_dir: Path, attempt: int, tasks: int) -> bool:
    """Whether every rank recorded its pid for ``attempt`` (its handlers are in) and the run is running."""
    paths = RunPaths(run_dir)
    for rank in range(tasks):
        try:
            record = json.loads(paths.pid_file(rank).read_text())
        except (FileNotFoundError, ValueError):
            return False
        if record.get("attempt") != attempt:
            return False
    state = state_of(run_dir)
    return state is not None and state.status in ("running", "stopping")


def job_gone(run_dir: Path) -> bool:
    from elfes.launcher.rundir.liveness import local_processes

    processes = local_processes(RunPaths(run_dir))
    return not processes["controller"] and not processes["task"]


def wait_ended(run_dir: Path, status: str) -> run_state.RunState:
    """Wait until the run's state is ``status`` and no process of its job is left; return the state."""
    state = wait_for(lambda: (s := state_of(run_dir)) is not None and s.status in run_state.ENDED and s,
                     what=f"the run to end {status}", run_dir=run_dir, may_end=True)
    assert state.status == status, f"the run ended {state.status}, not {status}\n{diagnostics(run_dir)}"
    wait_for(lambda: job_gone(run_dir), what="the job's processes to exit", run_dir=run_dir,
             may_end=True)
    return state_of(run_dir)


def preempt(run_dir: Path) -> None:
    assert elfes(["preempt", str(run_dir)]) == 0


def outcomes(state: run_state.RunState) -> list[tuple[str, str | None, str]]:
    return [(attempt.outcome, attempt.signal, attempt.launch) for attempt in state.attempts]
