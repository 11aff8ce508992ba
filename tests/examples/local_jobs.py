"""Real example jobs on the local executor: waiting for their runs, reading their records, cleaning up.

Shared by the example tests; a test module's ``run_dirs`` fixture yields from :func:`reaped_run_dirs`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from launching import kill_local_run

from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.liveness import local_processes
from elfes.launcher.rundir.paths import RunPaths

JOB_TIMEOUT_S = 300.0


def events(run_dir: Path) -> list[dict[str, Any]]:
    file = RunPaths(run_dir).events
    found = []
    for line in file.read_text().splitlines() if file.exists() else []:
        try:
            found.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return found


def state_of(run_dir: Path) -> run_state.RunState | None:
    return run_state.load_state(RunPaths(run_dir))


def job_gone(run_dir: Path) -> bool:
    processes = local_processes(RunPaths(run_dir))
    return not processes["controller"] and not processes["task"]


def diagnostics(run_dir: Path) -> str:
    paths = RunPaths(run_dir)
    parts = [paths.state.read_text() if paths.state.exists() else "(no state.json)"]
    for file in [*sorted(paths.logs.glob("attempt-*/rank-*.*")), paths.controller_log]:
        if file.is_file():
            parts += [f"--- {file} (tail) ---", file.read_text(errors="replace")[-3000:]]
    return "\n".join(parts)


def wait_for(condition: Callable[[], Any], what: str, run_dir: Path) -> Any:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {JOB_TIMEOUT_S:.0f} s waiting for {what}\n{diagnostics(run_dir)}")
        time.sleep(0.05)  # polling interval of the condition
    return value


def wait_ended(run_dir: Path) -> run_state.RunState:
    state = wait_for(lambda: (s := state_of(run_dir)) is not None and s.status in run_state.ENDED and s,
                     "the run to end", run_dir)
    wait_for(lambda: job_gone(run_dir), "the job's processes to exit", run_dir)
    return state


def training_in_attempt_1(run_dir: Path, tasks: int) -> bool:
    """Every rank recorded its pid for attempt 1 and the run logged a train record."""
    paths = RunPaths(run_dir)
    try:
        pids = [json.loads(paths.pid_file(rank).read_text()) for rank in range(tasks)]
    except (FileNotFoundError, ValueError):
        return False
    return all(pid["attempt"] == 1 for pid in pids) and any(event["event"] == "train" for event in events(run_dir))


def reaped_run_dirs() -> Iterator[list[Path]]:
    """A fixture's body: run directories whose jobs are SIGKILLed at teardown if still alive."""
    submitted: list[Path] = []
    yield submitted
    for run_dir in submitted:
        kill_local_run(run_dir)
