"""Reference runs started once per test session and shared by every module and every xdist worker that asks.

An uninterrupted run is what many end-to-end tests compare their interrupted run with, bit for bit. The same
spec always trains the same tensors, so the first test to ask for one submits it and every later test (of any
module, of tests/launcher and tests/slurm alike, on any worker) gets the same run directory: the
``straight_runs`` fixture of tests/conftest.py, which submits with :func:`submit_straight`. Runs are keyed by
their inputs (the spec less its name and run directory), kept in one folder of the session (beside the
workers' own temporary folders under xdist), and claimed under a file lock, so that two workers asking at once
start one run.

A worker waits at its session's end for the runs it started to end (other workers may still be reading them),
then ends what is left of their jobs.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from launching import REPOSITORY, kill_local_run, launch_environment

from elfes.files import exclusive_lock
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths

END_WAIT_S = 300.0  # at the session's end: how long a started run may still take to end before it is killed
QUICKSTART = "tests.launcher.entrypoints:slow_quickstart"  # unslowed (no step_delay_s): the quickstart job


def session_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """``name`` in the folder of this pytest session: the same folder for every xdist worker of one run (each
    worker's own temporary folder is ``popen-gwN`` inside it), a new one for each session."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class SharedRuns:
    """``get(inputs)``: the run directory of the run that ``start(folder, name)`` submits for ``inputs``, submitted
    by whichever test of the session asked first (``start`` returns at once; the run trains meanwhile)."""

    def __init__(self, folder: Path, start: Callable[[Path, str, dict[str, Any]], Path]) -> None:
        self.folder = folder
        self.start = start
        self.started: list[Path] = []

    def get(self, inputs: dict[str, Any]) -> Path:
        key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]
        record = self.folder / f"{key}.json"
        with exclusive_lock(self.folder / f"{key}.lock"):
            if record.exists():
                return Path(json.loads(record.read_text())["run_dir"])
            run_dir = self.start(self.folder, f"reference-{key}", inputs)
            self.started.append(run_dir)
            record.write_text(json.dumps({"run_dir": str(run_dir), "inputs": inputs}, default=str))
        return run_dir

    def finish(self) -> None:
        """Wait (at most :data:`END_WAIT_S`) until each run this process started has ended (its state.json says
        so), then kill what is left of its job."""
        deadline = time.monotonic() + END_WAIT_S
        for run_dir in self.started:
            while not ended(run_dir) and time.monotonic() < deadline:
                time.sleep(0.2)
            kill_local_run(run_dir)


def ended(run_dir: Path) -> bool:
    """Whether the run's state.json records its end."""
    state = run_state.load_state(RunPaths(run_dir))
    return state is not None and state.status in run_state.ENDED


def submit_straight(folder: Path, name: str, inputs: dict[str, Any]) -> Path:
    """Submit ``inputs`` (``entrypoint``, ``tasks``, ``config``) uninterrupted and unslowed on the local executor,
    as ``folder/name``; returns its run directory at once."""
    spec = folder / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "entrypoint": inputs["entrypoint"], "workdir": str(REPOSITORY), "run_dir": str(folder / name),
        "config": {**inputs["config"], "step_delay_s": 0.0},
        "resources": {"nodes": 1, "tasks_per_node": inputs["tasks"], "gpus_per_node": 0, "cpus_per_task": 1,
                      "mem_gb": 1, "timeout_min": 10},
        "env": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)},
    }))
    elfes = Path(sys.executable).with_name("elfes")
    submitted = subprocess.run([str(elfes), "submit", str(spec), "--executor", "local"], env=launch_environment(),
                               capture_output=True, text=True, timeout=180)
    assert submitted.returncode == 0 and "as local job" in submitted.stdout, submitted.stderr
    return folder / name
