"""``elfes status SWEEP_DIR``: one row per member (status, attempts, requeues, step, best metric, last
checkpoint), best first by the monitored metric, and the counts per status. Writes nothing.

Fast for large sweeps: member names come from ``sweep.json`` (no spec is parsed), ``state.json`` is
read as it is, /proc is scanned once for all members and only for members that have not ended, and
the run records are read from the head and tail of each ``events.jsonl`` (launcher/rundir/status_reading.py).
Torch-free.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..backends import backend_for
from ..slurm import SlurmQueue
from . import state as run_state
from .liveness import effective_state
from .paths import RunPaths, SweepPaths
from .state import RunStatus
from .status_reading import ProcessTable, needs_liveness, run_liveness, summary_from_ends
from .sweep_record import MemberRecord, SweepRecord, load_sweep, stall

# A member without state.json: queued for a local slot, or never handed over (cancelled before it started).
WAITING, NOT_STARTED = "waiting", "not started"
# A member whose state.json cannot be read (edited, damaged): shown as such, never as waiting.
UNREADABLE = "unreadable"
# Metrics where higher is better, by a word in their name; any other is sorted lowest first.
_HIGHER_IS_BETTER = ("acc", "f1", "auc", "score", "precision", "recall", "bleu", "map", "iou", "reward")


@dataclass(frozen=True)
class MemberStatus:
    run_dir: str
    name: str
    overrides: dict[str, Any]
    status: str  # a launcher.state status, "waiting", "not started" or "unreadable" (``error`` says why)
    executor: str | None
    job_id: str | None
    attempts: int
    requeues_used: int
    step: int | None
    planned_steps: int | None
    monitor: str | None
    best_metric: float | None
    best_step: int | None
    last_checkpoint: str | None
    error: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SweepStatus:
    sweep_dir: str
    name: str
    executor: str
    max_parallel: int
    members: list[MemberStatus]  # best first
    counts: dict[str, int]
    jobs: list[dict[str, Any]]
    scheduler: dict[str, Any] | None
    problems: dict[str, str]
    stalled: str | None = None  # why waiting members will not start (no live scheduler), or None
    # the members' goodput summed (elfes.records.goodput.Goodput.to_json, without attempts): their wall times,
    # parts and redone steps added, the compute the sweep used; None before any member has records
    goodput: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"sweep_dir": self.sweep_dir, "name": self.name, "executor": self.executor,
                "max_parallel": self.max_parallel, "members": [member.to_json() for member in self.members],
                "counts": self.counts, "jobs": self.jobs, "scheduler": self.scheduler, "problems": self.problems,
                "stalled": self.stalled, "goodput": self.goodput}


def member_is_live(paths: RunPaths, processes: ProcessTable) -> bool:
    """Whether the member holds a slot: handed over and not ended (a vanished local job does not)."""
    try:
        state = run_state.load_state(paths)
    except run_state.RunDamaged:
        return False
    if state is None or state.status in run_state.ENDED:
        return False
    if not backend_for(state.executor).runs_here:
        return True
    if state.status == RunStatus.SUBMITTED:  # a hand-over under way, or one cut short (submitter killed) that started nothing
        return processes.alive(paths) or _submitter_alive(state)
    return processes.alive(paths)


def _submitter_alive(state: run_state.RunState) -> bool:
    submission = state.submissions[-1] if state.submissions else None
    if submission is None or submission.pid is None or submission.host not in (None, socket.gethostname()):
        return submission is not None  # another host's submitter cannot be looked at: taken as alive
    try:
        os.kill(submission.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _last_checkpoint(paths: RunPaths) -> str | None:
    try:
        return str(paths.checkpoints / os.readlink(paths.last))
    except OSError:
        return None


def member_status(member: MemberRecord, queued: set[str], processes: ProcessTable | None,
                  queue: SlurmQueue | None = None) -> MemberStatus:
    paths = RunPaths(Path(member.run_dir))
    try:
        recorded = run_state.load_state(paths)
        error = None
    except run_state.RunDamaged as problem:
        recorded, error = None, str(problem)
    state = recorded
    if needs_liveness(recorded):
        state = effective_state(paths, recorded, run_liveness(paths, recorded, processes, queue))
    summary = summary_from_ends(paths) if recorded is not None else None
    if error is not None:
        status = UNREADABLE
    elif state is None:
        status = WAITING if member.name in queued else NOT_STARTED
    else:
        status = state.status
    return MemberStatus(
        run_dir=member.run_dir, name=member.name, overrides=member.overrides, status=status,
        executor=state.executor if state else None, job_id=state.job_id if state else None,
        attempts=len(state.attempts) if state else 0, requeues_used=state.requeues_used if state else 0,
        step=getattr(summary, "step", None), planned_steps=getattr(summary, "planned_steps", None),
        monitor=getattr(summary, "monitor", None), best_metric=getattr(summary, "best_metric", None),
        best_step=getattr(summary, "best_step", None), last_checkpoint=_last_checkpoint(paths),
        error=error or (state.error if state else None),
    )


def higher_is_better(monitor: str | None) -> bool:
    return bool(monitor and any(word in monitor.lower() for word in _HIGHER_IS_BETTER))


def best_first(members: list[MemberStatus]) -> list[MemberStatus]:
    """Sorted by the monitored metric, best first (members without one last, in sweep order)."""
    def key(member: MemberStatus) -> tuple[int, float]:
        if member.best_metric is None:
            return (1, 0.0)
        return (0, -member.best_metric if higher_is_better(member.monitor) else member.best_metric)

    return sorted(members, key=key)  # stable: ties keep the sweep's order


def sweep_status(sweep_dir: str | os.PathLike[str], record: SweepRecord | None = None) -> SweepStatus:
    paths = SweepPaths(Path(os.path.abspath(sweep_dir)))
    record = load_sweep(paths) if record is None else record
    queued = {entry["name"] for entry in record.queue}
    processes = ProcessTable.snapshot() if backend_for(record.executor).runs_here else None
    queue = SlurmQueue()  # one squeue for every SLURM member, asked at the first that may be live
    members = [member_status(member, queued, processes, queue) for member in record.members]
    counts = dict(Counter(member.status for member in members))
    counts["total"] = len(members)
    return SweepStatus(
        sweep_dir=str(paths.sweep_dir), name=record.name, executor=record.executor,
        max_parallel=record.max_parallel, members=best_first(members), counts=counts,
        jobs=[asdict(job) for job in record.jobs], scheduler=record.scheduler, problems=dict(record.problems),
        stalled=stall(paths, record) or _cut_short(paths, [m for m in members if m.name not in queued], processes),
        goodput=summed_goodput([RunPaths(Path(member.run_dir)) for member in members]))


def summed_goodput(members: list[RunPaths]) -> dict[str, Any] | None:
    """The goodput of ``members`` summed: each one's wall time, parts and redone steps added (members whose
    records cannot be read, or that have none yet, left out)."""
    from elfes.records.goodput import Goodput

    from .goodput_reading import NoTimings, run_goodput, scheduled_job_starts

    now = datetime.now(timezone.utc)
    states = []
    for paths in members:
        try:
            state = run_state.load_state(paths)
        except (run_state.RunDamaged, ValueError, OSError):
            continue
        if state is not None and state.attempts:
            states.append((paths, state))
    starts = scheduled_job_starts(state for _, state in states)  # one sacct for every member
    total: Goodput | None = None
    for paths, state in states:
        try:
            goodput = run_goodput(paths, state, now, starts)
        except (NoTimings, ValueError, OSError):
            continue
        total = goodput if total is None else Goodput(total.wall_s + goodput.wall_s, total.parts + goodput.parts,
                                                      total.redone_steps + goodput.redone_steps)
    return None if total is None else {**Goodput(total.wall_s, total.parts, total.redone_steps).to_json(), "attempts": []}


def _may_start(paths: RunPaths, state: run_state.RunState, processes: ProcessTable | None) -> bool:
    """Whether the job of a cut-short hand-over may run anyway (and record its start): a local job whose
    processes live, or a SLURM task whose pickle submitit wrote (an earlier array's pickle counts too: never
    called stalled on a guess)."""
    if backend_for(state.executor).runs_here:
        return processes is not None and processes.alive(paths)
    submission = state.submissions[-1]
    folder = Path(submission.submitit_folder) if submission.submitit_folder else paths.submitit
    task = "" if submission.array_task is None else f"_{submission.array_task}"
    return any(folder.glob(f"*{task}_submitted.pkl"))


def _cut_short(paths: SweepPaths, members: list[MemberStatus], processes: ProcessTable | None) -> str | None:
    """Why the sweep is stalled when a member's hand-over was cut short (its submitter killed before it recorded
    the job) and nothing but a resume settles it: its state stays "submitted" for good. None otherwise.
    ``members``: those not queued for the local scheduler (which settles a queued one)."""
    for member in members:
        if member.status != RunStatus.SUBMITTED:
            continue
        try:
            state = run_state.load_state(RunPaths(Path(member.run_dir)))
        except run_state.RunDamaged:
            continue
        if state is None or _submitter_alive(state) or _may_start(RunPaths(Path(member.run_dir)), state, processes):
            continue
        submission = state.submissions[-1]
        return (f"stalled: member {member.name}'s hand-over was cut short (its submitter, pid {submission.pid} on "
                f"{submission.host}, is gone), so its state will not change by itself; `elfes resume "
                f"{paths.sweep_dir}` settles it (adopting the job it started, if any)")
    return None
