"""Whether a run's job is still queued or alive, as far as this machine can tell: the local job's
processes in /proc, SLURM's ``squeue``/``sacct`` (launcher/slurm) for a cluster job, the tasks that recorded their
pids, and the run's state once a job that vanished without recording its end is counted lost.

Torch-free; reads files and asks SLURM, writes nothing. Every verb that looks at a live run uses it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from ..backends import backend_for
from ..slurm import SlurmQueue
from . import state as run_state
from .command_group import ProcessStat, is_member, process_stat
from .lost_cause import describe_lost
from .paths import RunPaths
from .state import RunStatus
from .task_files import cancel_requested, command_records

# The module a local job's controller runs (``python -m MODULE RUN_DIR/submitit``): ELFES's, which records how
# each task ended (launcher/submit/local_controller.py); submitit's own, which jobs started before it still run.
LOCAL_CONTROLLER_MODULE = "elfes.launcher.submit.local_controller"
CONTROLLER_MODULES = (LOCAL_CONTROLLER_MODULE, "submitit.local._local")
TASK_MODULE = "submitit.core._submit"


def _proc_cmdline(pid: int, stat: ProcessStat | None = None) -> list[str] | None:
    """The command line of a live (non-zombie) process, or None."""
    stat = stat or process_stat(pid)
    if stat is None or not stat.live:
        return None
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _same_folder(argument: str, folder: Path) -> bool:
    return os.path.realpath(argument) == os.path.realpath(folder)


def _is_process_of(cmdline: list[str] | None, paths: RunPaths, *modules: str) -> bool:
    """Whether a command line is ``python ... -m <module> <RUN_DIR/submitit>`` of this run, for one of ``modules``."""
    if not cmdline:
        return False
    return any(module in cmdline for module in modules) and _same_folder(cmdline[-1], paths.submitit)


def local_processes(paths: RunPaths) -> dict[str, list[int]]:
    """Live processes of this run's local job on this machine: ``{"controller": [...], "task": [...],
    "command": [...]}``; "command": the members of the process groups the tasks' commands lead (a
    wrapper's trainer too, and after its task was killed). One pass over /proc."""
    found: dict[str, list[int]] = {"controller": [], "task": [], "command": []}
    groups = {record["pgid"] for record in command_records(paths, host=socket.gethostname())}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = process_stat(int(entry.name))
        if stat is None or not stat.live:
            continue
        if stat.group in groups and is_member(stat, stat.group):
            found["command"].append(stat.pid)
            continue
        cmdline = _proc_cmdline(stat.pid, stat)
        if _is_process_of(cmdline, paths, *CONTROLLER_MODULES):
            found["controller"].append(stat.pid)
        elif _is_process_of(cmdline, paths, TASK_MODULE):
            found["task"].append(stat.pid)
    return found


@dataclass(frozen=True)
class Liveness:
    alive: bool | None  # None: cannot tell from here
    queue_state: str | None  # SLURM's state, "RUNNING"/"GONE" for a local job, None when unknown
    queue_reason: str | None = None  # SLURM's reason a job waits ("BeginTime", "Resources", ...)
    restarts: int | None = None  # SLURM's restart count of the job (RestartCnt)
    command: tuple[int, ...] = ()  # live processes of a local command job's process groups
    notes: tuple[str, ...] = ()  # what the tasks say of their command now (a stop signal held, and why)


def liveness(paths: RunPaths, state: run_state.RunState | None, queue: SlurmQueue | None = None) -> Liveness:
    """Whether the run's job is still queued or alive, as far as this machine can tell (a SLURM job
    looked up in ``queue`` when given)."""
    if state is None or state.job_id is None:
        return Liveness(None, None)
    if backend_for(state.executor).runs_here:
        processes = local_processes(paths)
        alive = any(processes.values())
        command = tuple(processes["command"])
        notes = tuple(f"rank {record['rank']}: {record['notice']}" for record in
                      command_records(paths, host=socket.gethostname()) if record.get("notice")) if command else ()
        if state.status in run_state.ENDED:
            return Liveness(alive, "EXITING" if alive else None, command=command, notes=notes)
        return Liveness(alive, "RUNNING" if alive else "GONE", command=command, notes=notes)
    entry = backend_for(state.executor).queued(state.job_id, queue)
    if entry is None:
        return Liveness(None, None)
    return Liveness(entry.alive, entry.state, entry.reason, entry.restarts)


class LivenessProbe:
    """:func:`liveness` for a polling loop, asking each backend at most every ``liveness_every_s`` of its own
    (squeue loads the cluster's controller, /proc answers at once), or every ``at_most_every_s`` when sooner."""

    def __init__(self, paths: RunPaths, *, at_most_every_s: float | None = None) -> None:
        self.paths = paths
        self.at_most_every_s = at_most_every_s
        self._last: tuple[float, str | None, Liveness] | None = None

    def __call__(self, state: run_state.RunState | None) -> Liveness:
        now = time.monotonic()
        key = None if state is None else f"{state.executor}:{state.job_id}:{state.status in run_state.ENDED}"
        if self._last is not None:
            at, last_key, live = self._last
            every = 0.0 if state is None else backend_for(state.executor).liveness_every_s
            if self.at_most_every_s is not None:
                every = min(every, self.at_most_every_s)
            if last_key == key and now - at < every:
                return live
        live = liveness(self.paths, state)
        self._last = (now, key, live)
        return live


def slurm_requeued_since_last_attempt(state: run_state.RunState | None, live: Liveness) -> bool:
    """Whether SLURM restarted the run's job after its last attempt started (its restart count grew):
    a preemption of a job that stopped on SIGTERM and waited, or a node failure; the relaunch has not
    recorded itself yet."""
    if state is None or not backend_for(state.executor).outlives_its_end or not live.alive or live.restarts is None:
        return False
    attempt = state.last_attempt
    if attempt is None or attempt.job_id != state.job_id:
        return False
    restart = run_state.token_restart(attempt.token)
    return restart is not None and live.restarts > restart


@overload
def effective_state(paths: RunPaths, state: run_state.RunState, live: Liveness) -> run_state.RunState: ...


@overload
def effective_state(paths: RunPaths, state: run_state.RunState | None, live: Liveness) -> run_state.RunState | None: ...


def effective_state(paths: RunPaths, state: run_state.RunState | None, live: Liveness) -> run_state.RunState | None:
    """``state`` as it is once a job that is gone without recording its end is counted lost, and once SLURM
    requeued the job after its last attempt started (its restart count grew; pure)."""
    if state is not None and slurm_requeued_since_last_attempt(state, live):
        return run_state.requeued_by_slurm(state)  # stopped on SIGTERM and waited, or its node failed
    if state is None or state.status in run_state.ENDED or state.status == RunStatus.SUBMITTED or live.alive is not False:
        return state
    return run_state.mark_lost(state, cancelled=cancel_requested(paths, state), error=describe_lost(paths, state))


def recorded_tasks(paths: RunPaths) -> list[dict[str, Any]]:
    """The pid records of the run's tasks that are still that task on this host (checked in /proc)."""
    host = socket.gethostname()
    tasks = []
    for file in sorted(paths.pids.glob("rank-*.json")) if paths.pids.is_dir() else ():
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if record.get("host") not in (None, host):
            continue
        if _is_process_of(_proc_cmdline(pid), paths, TASK_MODULE):
            tasks.append(record)
    return tasks
