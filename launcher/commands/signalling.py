"""The verbs that signal a live job: ``elfes preempt`` (the requeue signal: save ``last``, requeue,
resume) and ``elfes cancel`` (a cancel marker, then SIGTERM or ``scancel``).

Torch-free: they run on a login node (a local job's tasks are signalled by pid on this machine).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elfes.files import write_text_atomically

from ..backends import Backend, backend_for
from ..errors import EXIT_NOT_NOW, ElfesError
from ..job.command import FORWARD_HOLD_S
from ..rundir import state as run_state
from ..rundir.command_group import dispositions, group_members, signal_group
from ..rundir.liveness import effective_state, liveness, local_processes, recorded_tasks
from ..rundir.lookup import UsageError, recorded_spec, run_paths
from ..rundir.paths import RunPaths
from ..rundir.state import RunStatus
from ..rundir.task_files import command_records
from ..slurm import SIGNAL_ANSWER_S
from ..spec import SpecError
from ..spec.sections import Resources
from ..submit.scripts import requeue_signal

DEFAULT_KILL_WAIT_S = Resources().kill_wait_s


class ActionFailed(ElfesError, RuntimeError):
    """The verb cannot be carried out now (no live task to signal, SLURM command failed, ...)."""

    exit_code = EXIT_NOT_NOW


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


def _scancel(backend: Backend, job_id: str, what: str) -> None:
    completed = backend.cancel(job_id)
    if not completed.started:
        raise ActionFailed(f"cannot {what}: scancel is not on PATH here; run this on the cluster's login node")
    if completed.code != 0:
        raise ActionFailed(f"{completed.command} failed: {completed.stderr.strip() or completed.code}")


# How long a job gets to record that the signal reached it ("stopping", or its attempt ended).
SIGNAL_SEEN_S = 20.0


def _scancel_signal(paths: RunPaths, state: run_state.RunState, signum: signal.Signals) -> str | None:
    """``scancel --signal=USR2 JOB`` (the job's steps get it). Slurm 22.05 answers "Job can not be altered now"
    for an array task while other tasks of its array are pending, although the running task got the signal,
    and scancel then retries for about 95 s. So scancel gets SIGNAL_ANSWER_S to succeed; past that the
    run's own record decides: the job marks itself "stopping" (or ends its attempt) once the signal reached
    it. Returns a note for the user, or raises ActionFailed saying what is known."""
    answer = backend_for(state.executor).signal(str(state.job_id), signum.name.removeprefix("SIG"),
                                                timeout_s=SIGNAL_ANSWER_S)
    if not answer.started:
        raise ActionFailed("cannot preempt: scancel is not on PATH here; run this on the cluster's login node")
    if not answer.timed_out:
        if answer.code != 0:
            raise ActionFailed(f"{answer.command} failed: {answer.stderr.strip() or answer.code}")
        return None
    attempt = state.last_attempt.number if state.last_attempt is not None else None
    deadline = time.monotonic() + SIGNAL_SEEN_S
    while time.monotonic() < deadline:
        if _stop_recorded(paths, attempt):
            return (f"SLURM answered `{answer.command}` with \"try again later\" (as it does for an array task while "
                    "other tasks of its array are pending), but the job got the signal: it is stopping")
        time.sleep(0.2)
    raise ActionFailed(f"{answer.command}: SLURM kept answering \"Job can not be altered now, try again later\" (as it "
                       "does for an array task while other tasks of its array are pending, even when the signal "
                       f"arrived), and the job has not recorded a stop within {SIGNAL_SEEN_S:.0f} s; it may still be "
                       f"starting. Check `elfes status {paths.run_dir}` (\"stopping\" or a new attempt: it arrived) "
                       "before preempting again")


def _stop_recorded(paths: RunPaths, attempt: int | None) -> bool:
    """Whether the run recorded a stop since its attempt ``attempt``: "stopping", that attempt ended, or a later one."""
    try:
        state = run_state.load_state(paths)
    except run_state.RunDamaged:
        return False
    if state is None or state.last_attempt is None:
        return False
    last = state.last_attempt
    return state.status == RunStatus.STOPPING or last.number != attempt or last.ended


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
    backend = backend_for(state.executor)
    signum = requeue_signal()
    if state.status not in (RunStatus.RUNNING, RunStatus.STOPPING):
        raise ActionFailed(f"{run_dir}: the run is {state.status}, not running; preempt a running job "
                           "(`elfes status` shows when it runs)")
    if not backend.runs_here:
        note = _scancel_signal(paths, state, signum)
        return Signalled(paths.run_dir, state.executor, state.job_id, signum.name, [backend.job_name(state.job_id)],
                         note=note)
    # What the command does with the signal is read before it is sent: once the task forwards it, the
    # command may be saving and exiting, and a Python process on its way out has reset its handlers.
    note = _command_takes(paths, signum)
    targets = _signal_pids(recorded_tasks(paths), signum)
    if not targets:
        raise ActionFailed(f"{run_dir}: no task of job {state.job_id} has recorded its pid on this machine yet (it "
                           "installs its signal handlers first, a few seconds after it starts); try again shortly")
    return Signalled(paths.run_dir, state.executor, state.job_id, signum.name, targets, note=note)


def _command_takes(paths: RunPaths, requeue: signal.Signals) -> str | None:
    """What a command job's processes do with the requeue signal (read before it is sent), when it is
    not what a preemption needs."""
    notes = []
    for record in command_records(paths, host=socket.gethostname()):
        members = group_members(record["pgid"])
        view = dispositions(members, (requeue, signal.SIGTERM))
        if not members or view.catches(requeue):
            continue
        who = f"the command of rank {record.get('rank')} (pids {members})"
        if view.catches(signal.SIGTERM):
            notes.append(f"{who} catches SIGTERM but not {requeue.name}: its task sends it SIGTERM instead and "
                         f"requeues the job once it exits {128 + signal.SIGTERM} (128 + SIGTERM) after saving `last`")
        else:
            notes.append(f"{who} catches neither {requeue.name} nor SIGTERM (yet: it may still be starting): its task "
                         f"holds the signal until it does, at most {FORWARD_HOLD_S:.0f} s after the command started, "
                         f"then sends {requeue.name}, whose default action ends the command without saving; a command "
                         f"job catches SIGTERM and {requeue.name} (StopRequest().catch_signals(signals=...))")
    return "; ".join(notes) or None


def cancel(run_dir: str | os.PathLike[str]) -> Signalled:
    """Stop the run for good: a cancel marker first (the attempt ends "cancelled"), then SIGTERM to
    the tasks (local) or ``scancel`` (SLURM). The job saves ``last`` on the way out.

    The marker also wins over a requeue under way: rank 0 looks for it right before ``scontrol requeue``,
    and an attempt that starts with it (SLURM requeued the job anyway) ends cancelled and ``scancel``s
    its job."""
    paths = run_paths(run_dir)
    state = _live_state(paths)
    backend = backend_for(state.executor)
    live = liveness(paths, state)
    current = effective_state(paths, state, live)
    # A SLURM job that stopped on SIGTERM stays alive until SLURM ends it, and comes back if that was a
    # preemption: cancel it too. So are the processes a local command left running when its task was killed.
    if current.status in run_state.ENDED and not (backend.outlives_its_end and live.alive) and not live.command:
        return Signalled(paths.run_dir, state.executor, state.job_id, "none", [],
                         note=f"the run is already {current.status}; nothing to cancel")
    previous_cancel = _marker_age_s(paths)
    write_text_atomically(paths.cancel_marker, json.dumps({"at": run_state.now(), "host": socket.gethostname(),
                                                           "pid": os.getpid()}) + "\n")
    if not backend.runs_here:
        if state.job_id is None:
            return Signalled(paths.run_dir, state.executor, None, "none", [],
                             note="not submitted yet; the marker stops it")
        _scancel(backend, str(state.job_id), "cancel")
        run_state.update_recorded_state(paths, run_state.cancel_between_attempts)
        return Signalled(paths.run_dir, state.executor, state.job_id, "SIGTERM",
                         [f"{backend.job_name(state.job_id)} (scancel)"])
    tasks = recorded_tasks(paths)
    targets = _signal_pids(tasks, signal.SIGTERM)
    kill_wait_s = _kill_wait_s(paths)
    note = (f"a command job's task sends SIGTERM on to the command's processes, and SIGKILL {kill_wait_s} s later "
            "(resources.kill_wait_s) if they have not exited" if kill_wait_s is not None and targets else None)
    orphans, killed = _signal_orphaned_groups(paths, {int(task["pid"]) for task in tasks}, kill_wait_s,
                                              previous_cancel)
    targets += orphans
    if orphans and not killed:
        note = (f"the command's task is gone, so nothing escalates by itself: run `elfes cancel {paths.run_dir}` "
                f"again {kill_wait_s or DEFAULT_KILL_WAIT_S} s from now to SIGKILL what still runs then")
    if not targets:
        # Tasks still starting: the controller forwards SIGTERM, and the runtime sees the marker.
        for pid in local_processes(paths)["controller"]:
            try:
                os.kill(pid, signal.SIGTERM)
                targets.append(f"pid {pid} (the local controller, which forwards it to the tasks)")
            except ProcessLookupError:
                pass
        note = "no task had recorded its pid yet; a starting task sees the cancel marker"
    return Signalled(paths.run_dir, state.executor, state.job_id, "SIGKILL" if killed else "SIGTERM", targets,
                     note=note)


def _kill_wait_s(paths: RunPaths) -> int | None:
    """``resources.kill_wait_s`` of a command job's recorded spec; None for an entrypoint job."""
    try:
        spec = recorded_spec(paths)
    except SpecError:
        return None
    return spec.resources.kill_wait_s if spec is not None and spec.command else None


def _marker_age_s(paths: RunPaths) -> float | None:
    """Seconds since an earlier ``elfes cancel`` left its marker, or None."""
    try:
        return time.time() - paths.cancel_marker.stat().st_mtime
    except FileNotFoundError:
        return None


def _signal_orphaned_groups(paths: RunPaths, live_tasks: set[int], kill_wait_s: int | None,
                            previous_cancel: float | None) -> tuple[list[str], bool]:
    """SIGTERM the process groups of commands whose task is gone (killed before it reaped them), SIGKILL
    once an earlier cancel is ``kill_wait_s`` old; returns the targets and whether that was SIGKILL."""
    wait_s = kill_wait_s or DEFAULT_KILL_WAIT_S
    kill = previous_cancel is not None and previous_cancel >= wait_s
    targets = []
    for record in command_records(paths, host=socket.gethostname()):
        members = group_members(record["pgid"])
        if not members or record.get("task_pid") in live_tasks:
            continue  # a live task signals and reaps its own command
        signum = signal.SIGKILL if kill else signal.SIGTERM
        if signal_group(record["pgid"], signum):
            targets.append(f"process group {record['pgid']} (pids {members}: the command of rank {record.get('rank')}, "
                           f"attempt {record.get('attempt')}, whose task is gone)")
    return targets, kill
