"""The ``elfes plot`` verb: each run's records (and attempts, from ``state.json``) drawn to one file.

Kept apart from the other verbs so that only this verb loads matplotlib (through
:mod:`elfes.plot`, imported when the verb runs; ``elfes plot --help`` loads nothing of it). Torch-free.
Run directories need no launcher: one written by ``examples/quickstart/train.py`` plots too, its
resumes unlabelled as requeues since nothing recorded how they came about.

>>> result = plot(["runs/quickstart-job"], output="plot.png")  # doctest: +SKIP
>>> result.output, result.metrics  # doctest: +SKIP
(PosixPath('plot.png'), ('train/loss', 'eval/validation/loss', 'eval/validation/mae', 'eval/validation/rmse'))
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from elfes.contract import START_EVENTS
from elfes.records import EventsFileWarning, iter_events
from elfes.records.timeline import Timeline, TimelineBuilder, select_metrics

from ..rundir import state as run_state
from ..rundir.lookup import UsageError
from ..rundir.paths import RunPaths, SweepPaths
from ..spec import SpecError, load_spec
from .signalling import ActionFailed


@dataclass(frozen=True)
class PlottedRun:
    run_dir: Path
    name: str
    timeline: Timeline
    goodput: Any = None  # elfes.records.goodput.Goodput, where its records give one


@dataclass(frozen=True)
class Plotted:
    """What ``elfes plot`` drew: the file, the metrics (one panel each), the runs and the figure itself."""

    output: Path
    metrics: tuple[str, ...]
    runs: tuple[PlottedRun, ...]
    figure: Any  # a matplotlib Figure
    not_drawn: tuple[str, ...] = ()  # sweep members without run records yet (waiting, just handed over)
    notes: tuple[str, ...] = ()  # what the sweeps say of themselves (stalled)


def plot(run_dirs: Sequence[str | os.PathLike[str]], *, output: str | os.PathLike[str] | None = None,
         metrics: Sequence[str] = ()) -> Plotted:
    """Draw the runs' metrics against the step into ``output`` (``.png`` or ``.svg``).

    ``output`` defaults to ``RUN_DIR/plot.png`` for one run; several runs need it. ``metrics``
    defaults to the training loss and every evaluation metric.
    """
    labels = _sweep_members(run_dirs)  # a sweep folder stands for its members, labelled by their overrides
    if output is None and len(run_dirs) == 1 and labels:
        output = SweepPaths(run_dirs[0]).plot
    if labels:
        run_dirs = [run_dir for folder in run_dirs for run_dir in labels.get(str(folder), {str(folder): None})]
    if output is None:
        if len(run_dirs) != 1:
            raise UsageError("several runs are drawn into one file: name it with -o FILE.png (or FILE.svg)")
        output = RunPaths(run_dirs[0]).plot
    output = Path(output)
    if output.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"cannot write a plot to {output}: give a file name ending in .png or .svg")
    names = {run_dir: label for members in labels.values() for run_dir, label in members.items()}
    # A sweep member that has no run records yet (it waits for a slot, or is starting) has nothing to draw.
    not_drawn = tuple(names[str(run_dir)] for run_dir in run_dirs
                      if str(run_dir) in names and not RunPaths(run_dir).events.is_file())
    run_dirs = [run_dir for run_dir in run_dirs if str(run_dir) not in names or RunPaths(run_dir).events.is_file()]
    if not run_dirs:
        raise UsageError(f"no member of {', '.join(map(str, labels))} has run records yet (the first event is written "
                         "once a member starts training); `elfes status` shows where they are")
    runs = _labelled([_read_run(Path(run_dir), names.get(str(run_dir))) for run_dir in run_dirs])
    try:
        chosen = select_metrics([run.timeline for run in runs], metrics)
    except ValueError as error:
        raise UsageError(str(error)) from None
    try:
        from elfes import plot as drawing
    except ImportError as error:
        raise ActionFailed(str(error)) from None
    figure = drawing.draw([drawing.RunCurves(run.name, run.timeline, run.goodput) for run in runs], chosen)
    drawing.save(figure, output)
    return Plotted(output=output, metrics=chosen, runs=tuple(runs), figure=figure, not_drawn=not_drawn,
                   notes=_sweep_notes(labels))


def _sweep_notes(labels: Mapping[str, Any]) -> tuple[str, ...]:
    """A stalled sweep among those drawn says so (members wait and no scheduler will start them)."""
    from ..rundir.sweep_record import load_sweep, stall

    notes = []
    for folder in labels:
        paths = SweepPaths(folder)
        found = stall(paths, load_sweep(paths))
        if found:
            notes.append(f"sweep {folder}: {found}")
    return tuple(notes)


def _sweep_members(folders: Sequence[str | os.PathLike[str]]) -> dict[str, dict[str, str]]:
    """For each sweep folder among ``folders``: its members' run directories -> their overrides' label."""
    from ..rundir.sweep_record import is_sweep_dir, load_sweep

    return {str(folder): {member.run_dir: member.label for member in load_sweep(SweepPaths(folder)).members}
            for folder in folders if is_sweep_dir(folder)}


def _read_run(run_dir: Path, label: str | None = None) -> PlottedRun:
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a run directory (no such folder); give the folder holding events.jsonl")
    paths = RunPaths(run_dir)
    builder = TimelineBuilder()  # the events stream through it: a run of a million steps is never held whole
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EventsFileWarning)  # a line torn by a kill, or being written now
            for event in iter_events(run_dir):
                builder.add(event)
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None
    state = run_state.load_state(paths)
    recorded = _recorded_attempts(builder.start_events, state.attempts if state is not None else ())
    timeline = builder.build(launches=[attempt.launch if attempt is not None else None for attempt in recorded],
                             outcomes=[attempt.outcome if attempt is not None else None for attempt in recorded],
                             failures=[failure_label(attempt) for attempt in recorded])
    return PlottedRun(run_dir=run_dir, name=label or _run_name(paths), timeline=timeline, goodput=_goodput(paths, state))


def _goodput(paths: RunPaths, state: run_state.RunState | None) -> Any:
    """The run's goodput for its time bars, or None where its records give none."""
    from ..rundir.goodput_reading import NoTimings, run_goodput

    try:
        return run_goodput(paths, state, datetime.now(timezone.utc)) if state is not None and state.attempts else None
    except (NoTimings, ValueError, OSError):
        return None


def failure_label(attempt: run_state.Attempt | None) -> str | None:
    """A failed attempt's cause in a few words, and whether it was retried: ``"RuntimeError, retried"``,
    ``"hang, not retried"``; None for an attempt without a recorded failure."""
    failure = attempt.failure if attempt is not None else None
    if failure is None:
        return None
    cause = "hang" if failure.category == run_state.FailureCategory.HANG else failure.cause.partition(":")[0]
    if failure.category == run_state.FailureCategory.LOST:
        cause = "rank lost"
    return f"{cause}, {'retried' if failure.retried else 'not retried'}"


def _run_name(paths: RunPaths) -> str:
    """The job's name from its recorded spec, else the run directory's name."""
    if paths.spec.is_file():
        try:
            return load_spec(paths.spec, check_files=False).name
        except SpecError:
            pass
    return paths.run_dir.resolve().name


def _labelled(runs: list[PlottedRun]) -> list[PlottedRun]:
    """Runs whose names repeat (one spec, several run directories) are told apart by their folder."""
    names = [run.name for run in runs]
    return [run if names.count(run.name) == 1 else PlottedRun(run.run_dir, f"{run.name} ({run.run_dir})", run.timeline)
            for run in runs]


def _time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def _recorded_attempts(events: Sequence[Mapping[str, Any]],
                       attempts: Sequence[run_state.Attempt]) -> list[run_state.Attempt | None]:
    """The state.json attempt of each start event: the last one that began before it (rank 0 records
    an attempt before the engine starts), None when unknown."""
    begun = [(started, attempt) for attempt in attempts if (started := _time(attempt.started_at)) is not None]
    recorded: list[run_state.Attempt | None] = []
    for event in events:
        if event.get("event") not in START_EVENTS:
            continue
        at = _time(event.get("time"))
        recorded.append(next((attempt for started, attempt in reversed(begun) if at is not None and started <= at),
                             None))
    return recorded
