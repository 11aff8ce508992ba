"""``elfes status``: where a run stands, read from its files (state.json, the run records, the
checkpoints) and, for a cluster job, from SLURM. Writes nothing.

Torch-free: the run records' reader is imported only when a status is asked for.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..backends import backend_for
from ..rundir import state as run_state
from ..rundir.code_record import load_code_record
from ..rundir.goodput_reading import NoTimings, run_goodput
from ..rundir.liveness import effective_state
from ..rundir.lookup import recorded_data, run_paths
from ..rundir.paths import RunPaths
from ..rundir.provenance import environment_changes
from ..rundir.state import Launch, RunStatus
from ..rundir.status_reading import ProcessTable, recorded_name, run_liveness, summary_from_ends
from ..slurm import SlurmQueue

UNREADABLE = "unreadable"  # the status of a run whose state.json cannot be read


@dataclass(frozen=True)
class Status:
    """Where one run stands (``elfes status``); ``to_json()`` is the ``--json`` form."""

    run_dir: str
    name: str | None
    status: str  # one of launcher.state.STATUSES ("unknown" without state.json, UNREADABLE when it is damaged)
    executor: str | None
    job_id: str | None
    queue_state: str | None
    attempts: list[dict[str, Any]]
    requeues_used: int
    requeues_left: int | None
    max_requeues: int | None
    step: int | None
    planned_steps: int | None
    epoch: int | None
    epochs: int | None
    monitor: str | None
    best_metric: float | None
    best_step: int | None
    last_checkpoint: str | None
    last_event_time: str | None
    error: str | None
    notes: list[str] = field(default_factory=list)
    queue_reason: str | None = None  # why SLURM holds the job ("BeginTime" after a requeue, "Resources", ...)
    restart_count: int | None = None  # SLURM's restarts of the job (preemptions, requeues), while it is queued
    code: dict[str, Any] | None = None  # code.json: the code snapshot the job runs (None: none, it runs workdir)
    ran_on: str | None = None  # the latest attempt's provenance in one short line (attempts[].provenance: all of it)
    # failed attempts retried (requeue.max_failures) since the latest hand-over by hand, `failures_counted_since`
    # ("submit" or "resume"); each attempt's `failure` says why
    failures_used: int = 0
    failures_counted_since: str = Launch.SUBMIT
    # nodes the run's SLURM jobs leave out after a rank died or hung there (state.json's excluded_nodes)
    excluded_nodes: list[dict[str, Any]] = field(default_factory=list)
    # where the run's wall time went (elfes.records.goodput.Goodput.to_json: wall_s, goodput, parts, attempts);
    # None when it cannot be read cheaply (a note says why)
    goodput: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _last_checkpoint(paths: RunPaths) -> str | None:
    if not paths.last.is_symlink():
        return None
    return str(paths.checkpoints / os.readlink(paths.last))


def _pointer_notes(paths: RunPaths) -> list[str]:
    """What a resume will make of ``last`` when it cannot simply follow it (launcher/job/resume_point.py)."""
    if not paths.last.is_symlink():
        return []
    target = paths.last.resolve()
    if target.parent != paths.checkpoints.resolve():
        return [f"{paths.last} points to {target}, outside the run's checkpoint folder: `elfes resume` refuses it; "
                "point it at one of the run's checkpoints, or remove it"]
    if not target.exists():
        return [f"{paths.last} names {target.name}, which does not exist: `elfes resume` continues from the run's "
                "newest complete checkpoint"]
    return []


def run_status(run_dir: str | os.PathLike[str], processes: ProcessTable | None = None,
               queue: SlurmQueue | None = None) -> Status:
    """The status of one run directory. Reads files (and asks SLURM); writes nothing. Liveness is asked only
    of a run that has not ended (``processes``: one /proc scan, ``queue``: one squeue, shared by many runs); the run records are
    read from the head and tail of ``events.jsonl`` only (launcher/rundir/status_reading.py)."""
    paths = run_paths(run_dir)
    notes = _pointer_notes(paths)
    try:
        name = recorded_name(paths)
    except ValueError:
        name = None
        notes.append(f"{paths.spec} cannot be read")
    try:
        recorded = run_state.load_state(paths)
    except run_state.RunDamaged as error:
        return _unreadable(paths, name, str(error), notes)
    live = run_liveness(paths, recorded, processes, queue)
    state = effective_state(paths, recorded, live)
    if state is not recorded and state is not None and recorded is not None and state.status == RunStatus.REQUEUED:
        attempt = state.last_attempt
        if attempt is not None and not attempt.ended:
            notes.append(f"SLURM requeued job {state.job_id} (restart {live.restarts}) while attempt {attempt.number} "
                         f"was {recorded.status}, without that attempt recording its end (its node failed, or it "
                         "was killed); the job starts again by itself and resumes from `last`")
    elif state is not recorded and state is not None and recorded is not None:
        notes.append(f"the job is gone without recording its end (was {recorded.status}); `elfes resume` continues it")
    waits = state is not None and backend_for(state.executor).outlives_its_end and state.status == RunStatus.STOPPED
    if state is not None and waits and live.alive:
        notes.append(f"{backend_for(state.executor).job_name(state.job_id)} is still {live.queue_state}: it saved "
                     "`last` and waits for SLURM to "
                     "end it (a preempted job comes back by itself; `elfes cancel` keeps it from coming back)")
    notes.extend(live.notes)  # a command job's task holding a stop signal says why
    if state is not None and state.excluded_nodes and live.queue_reason == "BadConstraints":
        notes.append(f"SLURM job {state.job_id} cannot start: it leaves out {', '.join(state.excluded_hosts)} "
                     "(excluded after failures there) and too few nodes remain; `elfes cancel` it, then `elfes resume "
                     f"{paths.run_dir} --include-nodes`")
    if state is not None:
        notes.extend(environment_changes(state))
    try:
        code = load_code_record(paths)
    except run_state.RunDamaged as error:
        code = None
        notes.append(str(error))
    ran_on = next((attempt.provenance.describe() for attempt in reversed(state.attempts)
                   if attempt.provenance is not None), None) if state is not None else None
    summary = summary_from_ends(paths)
    notes.extend(getattr(summary, "warnings", ()))  # the engine's warnings since the latest start
    notes.extend(tracker_notes(paths, ended=state is not None and state.status in run_state.ENDED))
    goodput = _goodput(paths, state, notes)
    return Status(
        run_dir=str(paths.run_dir),
        name=name,
        status=state.status if state is not None else "unknown",
        executor=state.executor if state is not None else None,
        job_id=state.job_id if state is not None else None,
        queue_state=live.queue_state,
        attempts=[asdict(attempt) for attempt in state.attempts] if state is not None else [],
        requeues_used=state.requeues_used if state is not None else 0,
        requeues_left=state.requeues_left if state is not None else None,
        max_requeues=state.max_requeues if state is not None else None,
        step=getattr(summary, "step", None),
        planned_steps=getattr(summary, "planned_steps", None),
        epoch=getattr(summary, "epoch", None),
        epochs=getattr(summary, "epochs", None),
        monitor=getattr(summary, "monitor", None),
        best_metric=getattr(summary, "best_metric", None),
        best_step=getattr(summary, "best_step", None),
        last_checkpoint=_last_checkpoint(paths),
        last_event_time=getattr(summary, "last_event_time", None),
        error=state.error if state is not None else None,
        notes=notes,
        queue_reason=live.queue_reason,
        restart_count=live.restarts,
        code=asdict(code) if code is not None else None,
        ran_on=ran_on,
        failures_used=state.failures_used if state is not None else 0,
        failures_counted_since=state.failures_counted_since if state is not None else Launch.SUBMIT,
        excluded_nodes=[asdict(node) for node in state.excluded_nodes] if state is not None else [],
        goodput=goodput,
    )


def _goodput(paths: RunPaths, state: run_state.RunState | None, notes: list[str]) -> dict[str, Any] | None:
    """The run's goodput as JSON data (elfes.records.goodput), or None with a note saying why not."""
    try:
        return run_goodput(paths, state, datetime.now(timezone.utc)).to_json()
    except NoTimings as error:
        notes.append(f"no goodput: {error}")
    except ValueError as error:  # a time in state.json or the records that does not parse
        notes.append(f"no goodput: a recorded time cannot be read ({error})")
    return None


def tracker_notes(paths: RunPaths, *, ended: bool = False) -> list[str]:
    """A line per experiment tracker whose mirror is behind (since when, why, how much waits to be sent, and who
    sends it) and, for a run that has ended (no attempt of its own will send anything), per tracker whose mirror
    never started or whose run lacks the run's end: each names ``elfes sync RUN_DIR``."""
    trackers = _spec_trackers(paths) if ended else ()
    if not trackers and not paths.tracking.is_dir():  # no tracker mirrors this run: status stays free of its imports
        return []
    from elfes.records.tracker_lifecycle import read_lifecycle
    from elfes.records.tracker_sender import read_mirror_state
    from elfes.records.tracking import TRACKERS

    sync = f"`elfes sync {paths.run_dir}`"
    lifecycle = read_lifecycle(paths.run_dir) if ended else None
    notes = []
    for tracker in TRACKERS:
        mirror = read_mirror_state(paths.run_dir, tracker)
        if mirror is None:
            if tracker in trackers and paths.events.is_file():
                notes.append(f"the {tracker} mirror never started (the run ended first, or its attempt was killed): "
                             f"{tracker} has none of the run's records; {sync} sends them")
            continue
        if mirror.behind:
            try:
                waiting = max(0, paths.events.stat().st_size - mirror.offset)
            except OSError:
                waiting = 0
            who = (f"the run has ended, so no attempt of it sends them: {sync} does, at any time (nothing is sent twice)"
                   if ended else f"the running attempt sends them once {tracker} takes them again, else the run's "
                   f"next attempt, or {sync} once no attempt runs")
            notes.append(f"the {tracker} mirror is behind since {mirror.behind_since} ({mirror.error}): {waiting} bytes "
                         f"of events.jsonl wait to be sent; {who}")
        elif (tracker in trackers and lifecycle is not None and lifecycle.terminal
              and mirror.lifecycle_sent != lifecycle.digest()):  # the launcher sends the end to the spec's trackers
            notes.append(f"the {tracker} run does not say yet that the run ended {lifecycle.status} ({tracker} did not "
                         f"take it at the run's end); {sync} sends it")
    return notes


def _spec_trackers(paths: RunPaths) -> tuple[str, ...]:
    """The trackers the recorded spec's ``tracking:`` names, read without validating the spec; none when unread."""
    try:
        data = recorded_data(paths)
    except ValueError:
        return ()
    tracking = data.get("tracking") if data is not None else None
    # `tensorboard: {}` is a tracker turned on: only null is off.
    return tuple(name for name, settings in tracking.items() if settings is not None) if isinstance(tracking, dict) else ()


def _unreadable(paths: RunPaths, name: str | None, error: str, notes: list[str]) -> Status:
    """A run whose state.json cannot be read: status "unreadable", what its other files still tell."""
    summary = summary_from_ends(paths)
    notes.extend(getattr(summary, "warnings", ()))  # the engine's warnings since the latest start
    return Status(
        run_dir=str(paths.run_dir), name=name, status=UNREADABLE, executor=None, job_id=None, queue_state=None,
        attempts=[], requeues_used=0, requeues_left=None, max_requeues=None,
        step=getattr(summary, "step", None), planned_steps=getattr(summary, "planned_steps", None),
        epoch=getattr(summary, "epoch", None), epochs=getattr(summary, "epochs", None),
        monitor=getattr(summary, "monitor", None), best_metric=getattr(summary, "best_metric", None),
        best_step=getattr(summary, "best_step", None), last_checkpoint=_last_checkpoint(paths),
        last_event_time=getattr(summary, "last_event_time", None), error=error, notes=notes,
    )


def status(run_dirs: Sequence[str | os.PathLike[str]]) -> list[Status]:
    """The status of each run directory, in order."""
    processes = ProcessTable.snapshot()  # scanned once, on the first run that needs it
    queue = SlurmQueue()  # asked once, on the first SLURM run that needs it
    return [run_status(run_dir, processes, queue) for run_dir in run_dirs]
