"""Where a run stands: :func:`summarize` derives a :class:`RunSummary` from its events. Torch-free and rich-free."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from elfes.contract import START_EVENTS, STOP_EVENTS, EventKind

from .plain import event_epoch, format_number, format_seconds


@dataclass(frozen=True)
class RunSummary:
    """Where a run stands, as derived by :func:`summarize`.

    ``status`` is "finished", "stopped" or "failed" when the last start
    (started or resumed) was followed by that event, else "running", which
    also covers a job killed without a stop: compare ``last_event_time`` with
    the clock. ``warnings`` are the messages of the ``warning`` events since
    the last start. ``failure`` is the exception of a failed run ("ValueError:
    message"); ``pending_stop`` the signal or reason of a stop requested since
    the last start and not yet saved (None once ``stopped`` is recorded).
    Progress fields come from the last event that carries them and are None
    when no event does; ``epoch`` is the 1-based epoch the run is in (see
    :func:`~elfes.records.epoch_number`) and ``epochs`` the budget's. Durations
    are summed over finished/stopped events.
    """

    status: Literal["running", EventKind.FINISHED, EventKind.STOPPED, EventKind.FAILED]
    step: int | None
    planned_steps: int | None
    epoch: int | None
    epochs: int | None
    samples: int | None
    best_metric: float | None
    best_step: int | None
    monitor: str | None
    starts: int
    resumes: int
    stops: tuple[str, ...]
    checkpoints: int
    last_checkpoint: str | None
    train_s: float
    evaluation_s: float
    checkpoint_s: float
    last_event_time: str | None
    failure: str | None
    pending_stop: str | None
    warnings: tuple[str, ...] = ()


_PROGRESS_KEYS = ("step", "samples", "best_metric", "best_step")


def summarize(events: Iterable[Mapping[str, Any]]) -> RunSummary:
    """Summarise a run's events (as returned by :func:`~elfes.records.read_events`). Any process.

    Unknown event names are ignored, so older tools can read newer runs.
    ``stops`` lists the reasons of ``stopped`` events, in order.

    Example:
        >>> summarize(read_events(Path("runs/a"))).status  # doctest: +SKIP
        'finished'
    """
    events = list(events)
    if not events:
        raise ValueError(
            "no events to summarise; the events file is empty or holds only torn "
            "lines, so wait for the run to log its first event"
        )
    status: Literal["running", EventKind.FINISHED, EventKind.STOPPED, EventKind.FAILED] = "running"
    failure = pending_stop = None
    progress: dict[str, Any] = dict.fromkeys((*_PROGRESS_KEYS, "epoch"))
    planned_steps = epochs = monitor = last_checkpoint = None
    starts = resumes = checkpoints = 0
    stops: list[str] = []
    warned: list[str] = []
    totals = dict.fromkeys(("train_s", "evaluation_s", "checkpoint_s"), 0.0)

    for event in events:
        name = event.get("event")
        state = event.get("state")
        state = state if isinstance(state, Mapping) else {}
        for key in _PROGRESS_KEYS:
            if key in event:
                progress[key] = event[key]
            elif key in state:
                progress[key] = state[key]
        epoch = event_epoch(event)
        if epoch is not None:
            progress["epoch"] = epoch
        budget = event.get("budget")
        if isinstance(budget, Mapping) and "planned_steps" in budget:
            planned_steps = budget["planned_steps"]
            epochs = budget.get("epochs")
        elif "planned_steps" in event:
            planned_steps = event["planned_steps"]

        if name in START_EVENTS:
            status = "running"
            failure = pending_stop = None
            warned = []
            starts += 1
            if name == EventKind.RESUMED:
                resumes += 1
        elif name in (EventKind.FINISHED, EventKind.STOPPED):
            status = name
            for key in totals:
                totals[key] += event.get(key) or 0.0
            if name == EventKind.STOPPED:
                stops.append(str(event.get("reason")))
            pending_stop = None
        elif name == EventKind.FAILED:
            status = EventKind.FAILED
            failure = f"{event.get('exception')}: {event.get('message')}"
        elif name in STOP_EVENTS and pending_stop is None:
            pending_stop = str(event.get("signal") or event.get("reason"))
        elif name == EventKind.EVALUATION:
            monitor = event.get("monitor")
        elif name == EventKind.CHECKPOINT:
            checkpoints += 1
            last_checkpoint = event.get("path")
        elif name == EventKind.WARNING:
            warned.append(str(event.get("message")))

    return RunSummary(
        status=status,
        planned_steps=planned_steps,
        epochs=epochs,
        monitor=monitor,
        starts=starts,
        resumes=resumes,
        stops=tuple(stops),
        checkpoints=checkpoints,
        last_checkpoint=last_checkpoint,
        last_event_time=events[-1].get("time"),
        failure=failure,
        pending_stop=pending_stop,
        warnings=tuple(warned),
        **progress,
        train_s=totals["train_s"],
        evaluation_s=totals["evaluation_s"],
        checkpoint_s=totals["checkpoint_s"],
    )


def format_summary(summary: RunSummary) -> str:
    """Render a :class:`RunSummary` as a few plain lines for humans. Any process.

    Example:
        >>> print(format_summary(summarize(read_events(Path("runs/a")))))  # doctest: +SKIP
        status: finished (1 start(s), 0 resume(s))
        progress: epoch 2/2, step 100/100, 6400 samples
        ...
    """
    status: str = summary.status
    if status == "running" and summary.pending_stop is not None:
        status = f"running, stop requested ({summary.pending_stop}): saving last (or killed before it was saved)"
    elif status == "running":
        status = "running (or killed: no finish or stop after the last start)"
    epoch = format_number(summary.epoch) + ("" if summary.epochs is None else f"/{summary.epochs}")
    lines = [
        f"status: {status} ({summary.starts} start(s), {summary.resumes} resume(s))",
        f"progress: epoch {epoch}, step {format_number(summary.step)}/"
        f"{format_number(summary.planned_steps)}, {format_number(summary.samples)} samples",
    ]
    if summary.failure is not None:
        lines.append(f"failure: {summary.failure} (fix the cause, then resume from last)")
    if summary.best_metric is not None:
        lines.append(
            f"best: {summary.monitor or 'metric'} = {format_number(summary.best_metric)} "
            f"at step {format_number(summary.best_step)}"
        )
    if summary.stops:
        lines.append(f"stops: {', '.join(summary.stops)}")
    lines.extend(f"warning: {message}" for message in summary.warnings)
    lines.append(f"checkpoints: {summary.checkpoints}, last: {summary.last_checkpoint or 'none'}")
    lines.append(
        f"time: train {format_seconds(summary.train_s)}, evaluation "
        f"{format_seconds(summary.evaluation_s)}, checkpoint {format_seconds(summary.checkpoint_s)}"
    )
    lines.append(f"last event: {summary.last_event_time or 'n/a'}")
    return "\n".join(lines)
