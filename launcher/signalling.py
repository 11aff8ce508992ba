"""The verbs that signal a live job: ``elfes preempt`` (the requeue signal: save ``last``, requeue,
resume) and ``elfes cancel`` (a cancel marker, then SIGTERM or ``scancel``).

Torch-free: they run on a login node (a local job's tasks are signalled by pid on this machine).
"""

from __future__ import annotations

import json
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elfes.files import write_text_atomically

from . import executors
from . import state as run_state
from .liveness import effective_state, liveness, local_processes, recorded_tasks, run_slurm_tool
from .paths import RunPaths
from .run_dir import UsageError, run_paths


class ActionFailed(RuntimeError):
    """The verb cannot be carried out now (no live task to signal, SLURM command failed, ...)."""


@dataclass(frozen=True)
class Signalled:
    run_dir: Path
    executor: str
    job_id: str | None
    signal: str
    targets: list[str]  # what got the signal ("pid 1234 (rank 0)", "SLURM job 77")
    note: str | None = None


def _live_state(paths: RunPaths) -> run_state.RunState:
    state = run_state.load_state(paths)
    if state is None:
        raise UsageError(f"{paths.run_dir}: no state.json (the job was never submitted); use `elfes submit`")
    return state


def _scancel(arguments: list[str], what: str) -> None:
    completed = run_slurm_tool(["scancel", *arguments])
    if completed is None:
        raise ActionFailed(f"cannot {what}: scancel is not on PATH here; run this on the cluster's login node")
    if completed.returncode != 0:
        raise ActionFailed(f"scancel {' '.join(arguments)} failed: {completed.stderr.strip() or completed.returncode}")


def _signal_pids(records: list[dict[str, Any]], signum: int) -> list[str]:
    targets = []
    for record in records:
        try:
            os.kill(int(record["pid"]), signum)
        except ProcessLookupError:
            continue
        targets.append(f"pid {record['pid']} (rank {record.get('rank')}, attempt {record.get('attempt')})")
    return targets


def preempt(run_dir: str | os.PathLike[str]) -> Signalled:
    """Rehearse a preemption: the job's tasks get the requeue signal, save ``last``, are requeued and resume."""
    paths = run_paths(run_dir)
    state = _live_state(paths)
    signum = executors.requeue_signal()
    if state.status not in ("running", "stopping"):
        raise ActionFailed(f"{run_dir}: the run is {state.status}, not running; preempt a running job "
                           "(`elfes status` shows when it runs)")
    if state.executor == "slurm":
        _scancel([f"--signal={signum.name.removeprefix('SIG')}", str(state.job_id)], "preempt")
        return Signalled(paths.run_dir, "slurm", state.job_id, signum.name, [f"SLURM job {state.job_id}"])
    targets = _signal_pids(recorded_tasks(paths), signum)
    if not targets:
        raise ActionFailed(f"{run_dir}: no task of job {state.job_id} has recorded its pid on this machine yet (it "
                           "installs its signal handlers first, a few seconds after it starts); try again shortly")
    return Signalled(paths.run_dir, "local", state.job_id, signum.name, targets)


def cancel(run_dir: str | os.PathLike[str]) -> Signalled:
    """Stop the run for good: a cancel marker first (the attempt ends "cancelled"), then SIGTERM to
    the tasks (local) or ``scancel`` (SLURM). The job saves ``last`` on the way out.

    The marker also wins over a requeue under way: rank 0 looks for it right before ``scontrol requeue``,
    and an attempt that starts with it (SLURM requeued the job anyway) ends cancelled and ``scancel``s
    its job."""
    paths = run_paths(run_dir)
    state = _live_state(paths)
    live = liveness(paths, state)
    current = effective_state(paths, state, live)
    # A SLURM job that stopped on SIGTERM stays alive until SLURM ends it, and comes back if that was a
    # preemption: cancel it too.
    if current.status in run_state.ENDED and not (state.executor == "slurm" and live.alive):
        return Signalled(paths.run_dir, state.executor, state.job_id, "none", [],
                         note=f"the run is already {current.status}; nothing to cancel")
    write_text_atomically(paths.cancel_marker, json.dumps({"at": run_state.now(), "host": socket.gethostname(),
                                                           "pid": os.getpid()}) + "\n")
    if state.executor == "slurm":
        if state.job_id is None:
            return Signalled(paths.run_dir, "slurm", None, "none", [], note="not submitted yet; the marker stops it")
        _scancel([str(state.job_id)], "cancel")
        return Signalled(paths.run_dir, "slurm", state.job_id, "SIGTERM", [f"SLURM job {state.job_id} (scancel)"])
    targets = _signal_pids(recorded_tasks(paths), signal.SIGTERM)
    note = None
    if not targets:
        # Tasks still starting: the controller forwards SIGTERM, and the runtime sees the marker.
        for pid in local_processes(paths)["controller"]:
            try:
                os.kill(pid, signal.SIGTERM)
                targets.append(f"pid {pid} (the local controller, which forwards it to the tasks)")
            except ProcessLookupError:
                pass
        note = "no task had recorded its pid yet; a starting task sees the cancel marker"
    return Signalled(paths.run_dir, "local", state.job_id, "SIGTERM", targets, note=note)
