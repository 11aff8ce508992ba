"""A run's curves and interruptions, from its events: attempts, the kept path, lost segments, markers.

:func:`build_timeline` splits the events of ``events.jsonl`` into attempts (one per ``started`` or
``resumed`` event) and every scalar metric into series against the optimizer step:

- the **kept** path: the points that the finished (or current) run is made of, steps strictly increasing;
- **lost** segments: points logged by an attempt and then trained again, because a later attempt resumed
  from an earlier step (a kill after the last checkpoint, a crash, or a resume from an older checkpoint).
  A point at step ``s`` of attempt ``a`` is lost when some attempt after ``a`` starts at a step below ``s``;
- **lost spans**: the step ranges of that lost work, per attempt;
- **markers**: each attempt's start (``start``, ``resume`` or ``requeue``), each stop with its signal,
  each kill (an attempt that recorded no end yet was followed by another) and each failure.

Metric names are those of the TensorBoard mirror (:mod:`elfes.records.tensorboard`): ``train/<metric>`` for the
metrics of ``train`` events (``train/loss``, ``train/lr/decay``) and ``eval/<loader>/<metric>`` for
evaluations (``eval/validation/loss``). Values recorded as null (non-finite) are left out.

Torch-free, rich-free and matplotlib-free: ``elfes plot`` draws what this module computes.

Example:
    >>> timeline = build_timeline(read_events(Path("runs/a")))  # doctest: +SKIP
    >>> timeline.series["train/loss"].kept_steps  # doctest: +SKIP
    (5, 10, 15, 20)
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from elfes.contract import END_EVENTS, START_EVENTS, EventKind

TRAIN_PREFIX = "train/"
EVAL_PREFIX = "eval/"
DEFAULT_METRIC = "train/loss"

MarkerKind = Literal["start", "resume", "requeue", "stop", "killed", "failed"]
# How an attempt ended: the kind of its end event, or killed (another attempt followed it) or running.
AttemptEnd = Literal[EventKind.FINISHED, EventKind.STOPPED, EventKind.FAILED, "killed", "running"]
Launch = Literal["start", "resume", "requeue"]


@dataclass(frozen=True)
class Attempt:
    """One start of the training loop and how it ended.

    ``number`` counts start events from 1; ``launch`` is ``start`` (a ``started`` event), ``requeue``
    (the launcher relaunched the job by itself) or ``resume``. ``end`` is ``killed`` for an attempt
    that recorded no end and was followed by another, ``running`` for the last one without an end.
    ``last_step`` is the highest step it logged (its start step when it logged none).
    """

    number: int
    launch: Launch
    start_step: int
    end: AttemptEnd
    end_step: int | None
    last_step: int
    stop_signal: str | None = None  # the stop's signal (or reason when code requested it)
    failure: str | None = None  # the exception's type name, or the launcher's account (cause, retried or not)
    cancelled: bool = False  # the launcher recorded the stop as a cancel (`elfes cancel`)
    world_size: int | None = None  # the ranks it trained on, as its start event says


@dataclass(frozen=True)
class Marker:
    """An interruption to draw on the step axis: ``label`` names it for humans (``stop (SIGTERM)``)."""

    step: int
    kind: MarkerKind
    attempt: int
    label: str


@dataclass(frozen=True, slots=True)  # slots: a run of a million steps holds a million points
class Point:
    step: int
    value: float
    attempt: int


@dataclass(frozen=True)
class Series:
    """One metric: the kept path (steps strictly increasing), held as columns since a long run has a million
    points, and ``lost`` segments (one per attempt that lost work)."""

    name: str
    kept_steps: tuple[int, ...]
    kept_values: tuple[float, ...]
    kept_attempts: tuple[int, ...]
    lost: tuple[tuple[Point, ...], ...]

    @property
    def kept(self) -> tuple[Point, ...]:
        """The kept path as points."""
        return tuple(map(Point, self.kept_steps, self.kept_values, self.kept_attempts))


@dataclass(frozen=True)
class LostSpan:
    """Steps ``after_step`` (exclusive) to ``last_step`` that ``attempt`` trained and a later attempt trained again."""

    attempt: int
    after_step: int
    last_step: int


@dataclass(frozen=True)
class Timeline:
    """What :func:`build_timeline` derives from a run's events."""

    attempts: tuple[Attempt, ...]
    markers: tuple[Marker, ...]
    series: dict[str, Series]
    lost_spans: tuple[LostSpan, ...] = ()

    @property
    def metric_names(self) -> tuple[str, ...]:
        """Every metric, train metrics first, each group in order of first appearance."""
        return tuple(self.series)

    def default_metrics(self) -> tuple[str, ...]:
        """What ``elfes plot`` draws without ``--metric``: the training loss and every evaluation metric."""
        names = [DEFAULT_METRIC] if DEFAULT_METRIC in self.series else []
        return (*names, *(name for name in self.series if name.startswith(EVAL_PREFIX)))


def select_metrics(timelines: Sequence[Timeline], requested: Sequence[str] = ()) -> tuple[str, ...]:
    """The metrics to draw for these runs: ``requested`` (checked) or the defaults of every run, in order.

    Raises ``ValueError`` naming a requested metric that no run recorded, with the names they did.

    Example:
        >>> select_metrics([build_timeline([{"event": "train", "step": 1, "metrics": {"loss": 1.0}}])])
        ('train/loss',)
    """
    known = dict.fromkeys(name for timeline in timelines for name in timeline.metric_names)
    if requested:
        unknown = [name for name in requested if name not in known]
        if unknown:
            raise ValueError(
                f"no run recorded the metric(s) {', '.join(map(repr, unknown))}; the runs have: "
                f"{', '.join(known) or 'no metrics yet (no train or evaluation event)'}"
            )
        return tuple(dict.fromkeys(requested))
    chosen = tuple(dict.fromkeys(name for timeline in timelines for name in timeline.default_metrics()))
    if not chosen:
        raise ValueError(
            "the runs recorded no training loss or evaluation metric yet; wait for their first train event "
            f"or name a metric with --metric (they have: {', '.join(known) or 'none'})"
        )
    return chosen


def event_scalars(event: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of a ``train`` or ``evaluation`` event by metric name (empty for other events).

    Values that are not numbers (null for non-finite, booleans) are left out.

    Example:
        >>> event_scalars({"event": "evaluation", "step": 8, "metrics": {"validation": {"loss": 0.5}}})
        {'eval/validation/loss': 0.5}
    """
    metrics = event.get("metrics")
    if type(metrics) is not dict and not isinstance(metrics, Mapping):
        return {}
    kind = event.get("event")
    scalars: dict[str, float] = {}
    if kind == EventKind.TRAIN:
        for name, value in metrics.items():
            if _is_number(value):
                scalars[TRAIN_PREFIX + str(name)] = float(value)
    elif kind == EventKind.EVALUATION:
        for loader, values in metrics.items():
            if isinstance(values, Mapping):
                for name, value in values.items():
                    if _is_number(value):
                        scalars[f"{EVAL_PREFIX}{loader}/{name}"] = float(value)
    return scalars


def _is_number(value: Any) -> bool:
    """A real number that is not a boolean (float and int answered without the slower ABC check)."""
    kind = type(value)
    return kind is float or kind is int or (kind is not bool and isinstance(value, numbers.Real))


def _state_step(event: Mapping[str, Any]) -> int | None:
    state = event.get("state")
    step = state.get("step") if isinstance(state, Mapping) else None
    return step if isinstance(step, int) else None


def _event_step(event: Mapping[str, Any]) -> int | None:
    step = event.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else _state_step(event)


class _AttemptParts:
    """What one attempt's events leave for the timeline, gathered as they stream by (no event is kept):
    its first event, its step range, its last end and stop request, and its points per metric."""

    def __init__(self, first: Mapping[str, Any]) -> None:
        self.first = first
        self.low_step: int | None = None
        self.high_step: int | None = None
        self.end_event: Mapping[str, Any] | None = None
        self.stop_requested: Mapping[str, Any] | None = None
        self.points: dict[str, tuple[list[int], list[float]]] = {}

    def add(self, event: Mapping[str, Any], kind: Any, step: int | None) -> None:
        """Take one event of the attempt: its ``kind`` (``event``) and its step (:func:`_event_step`)."""
        if step is not None:
            if self.low_step is None or self.high_step is None:  # both are set together
                self.low_step = self.high_step = step
            elif step > self.high_step:
                self.high_step = step
            elif step < self.low_step:
                self.low_step = step
        if kind in END_EVENTS:
            self.end_event = event
        elif kind == EventKind.STOP_REQUESTED:
            self.stop_requested = event


class TimelineBuilder:
    """:func:`build_timeline` fed one event at a time, keeping only what the timeline is made of (each
    attempt's start and end events and the metric values), so that a run of a million events is drawn
    without holding them. Any process.

    Example:
        >>> builder = TimelineBuilder()
        >>> for event in iter_events(Path("runs/a")):  # doctest: +SKIP
        ...     builder.add(event)
        >>> timeline = builder.build()  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._attempts: list[_AttemptParts] = []
        self._names: dict[str, None] = {}  # every metric with a point, in order of first appearance

    def add(self, event: Mapping[str, Any]) -> None:
        """Take the run's next event (oldest first)."""
        kind = event.get("event")
        if kind in START_EVENTS or not self._attempts:
            self._attempts.append(_AttemptParts(event))  # events before the first start form an attempt of their own
        parts = self._attempts[-1]
        step = event.get("step")
        if type(step) is not int:  # type(): a bool is no step
            parts.add(event, kind, _event_step(event))
            return
        parts.add(event, kind, step)
        if kind != EventKind.TRAIN and kind != EventKind.EVALUATION:
            return
        for name, value in event_scalars(event).items():
            found = parts.points.get(name)
            if found is None:
                found = parts.points[name] = ([], [])
                self._names.setdefault(name)
            found[0].append(step)
            found[1].append(value)

    @property
    def start_events(self) -> list[Mapping[str, Any]]:
        """The ``started`` and ``resumed`` events seen so far, in order."""
        return [parts.first for parts in self._attempts if parts.first.get("event") in START_EVENTS]

    def build(self, *, launches: Sequence[str | None] | None = None,
              outcomes: Sequence[str | None] | None = None,
              failures: Sequence[str | None] | None = None) -> Timeline:
        """The :class:`Timeline` of the events taken (``launches``, ``outcomes`` and ``failures`` as in
        :func:`build_timeline`)."""
        launches, outcomes, failures = list(launches or ()), list(outcomes or ()), list(failures or ())
        count = len(self._attempts)
        attempts = [
            _attempt(number, parts, launches[number - 1] if number <= len(launches) else None,
                     outcomes[number - 1] if number <= len(outcomes) else None, number < count,
                     failures[number - 1] if number <= len(failures) else None)
            for number, parts in enumerate(self._attempts, start=1)
        ]
        # An attempt's point at step s is lost when a later attempt starts below s: that step was trained again.
        redo_from: list[float] = [float("inf")] * count
        for index in range(count - 2, -1, -1):
            redo_from[index] = min(redo_from[index + 1], attempts[index + 1].start_step)
        kept: dict[str, tuple[list[int], list[float], list[int]]] = {name: ([], [], []) for name in self._names}
        lost: dict[str, dict[int, list[Point]]] = {}
        for attempt, parts, redo in zip(attempts, self._attempts, redo_from):
            for name, (steps, values) in parts.points.items():
                number = attempt.number
                kept_steps, kept_values, kept_attempts = kept[name]
                if redo == float("inf") or max(steps) <= redo:  # the usual case: nothing of it was trained again
                    kept_steps.extend(steps)
                    kept_values.extend(values)
                    kept_attempts.extend(itertools.repeat(number, len(steps)))
                    continue
                for step, value in zip(steps, values):
                    if step > redo:
                        lost.setdefault(name, {}).setdefault(number, []).append(Point(step, value, number))
                    else:
                        kept_steps.append(step)
                        kept_values.append(value)
                        kept_attempts.append(number)
        # Train metrics first, then evaluations; each group in order of first appearance.
        names = sorted(kept, key=lambda name: not name.startswith(TRAIN_PREFIX))
        series = {
            name: Series(name, tuple(kept[name][0]), tuple(kept[name][1]), tuple(kept[name][2]),
                         tuple(tuple(points) for points in lost.get(name, {}).values()))
            for name in names
        }
        known = [None] + [attempt.world_size for attempt in attempts]  # each attempt's, or the last one known
        for index in range(1, len(known)):
            known[index] = known[index] if known[index] is not None else known[index - 1]
        markers = tuple(marker for index, attempt in enumerate(attempts) for marker in _markers(attempt, known[index]))
        spans = tuple(LostSpan(attempt.number, max(int(redo), attempt.start_step), attempt.last_step)
                      for attempt, redo in zip(attempts, redo_from) if attempt.last_step > redo)
        return Timeline(attempts=tuple(attempts), markers=markers, series=series, lost_spans=spans)


def _attempt(number: int, parts: _AttemptParts, launch: str | None, outcome: str | None,
             followed: bool, failure_label: str | None = None) -> Attempt:
    first = parts.first
    kind: Launch = "start" if first.get("event") == EventKind.STARTED else ("requeue" if launch == "requeue" else "resume")
    start_step = _state_step(first) if first.get("event") in START_EVENTS else None
    if start_step is None:
        start_step = parts.low_step if parts.low_step is not None else 0
    end_event = parts.end_event
    end: AttemptEnd = "killed" if followed else "running"
    end_step = stop_signal = failure = None
    if end_event is not None:
        end = end_event["event"]
        end_step = _event_step(end_event)
        if end == EventKind.STOPPED:
            requested = parts.stop_requested or {}
            stop_signal = str(requested.get("signal") or end_event.get("reason") or "stop requested")
        elif end == EventKind.FAILED:
            failure = str(end_event.get("exception") or "exception")
    if failure_label is not None and end in (EventKind.FAILED, "killed", "running"):
        # The launcher's account of the failure: the cause (another rank's, or a hang that left no end
        # record) and whether it was retried, instead of what this rank's records say.
        end, failure = EventKind.FAILED, failure_label
    last_step = parts.high_step if parts.high_step is not None else start_step
    return Attempt(number=number, launch=kind, start_step=start_step, end=end, end_step=end_step,
                   last_step=last_step, stop_signal=stop_signal, failure=failure,
                   cancelled=end == EventKind.STOPPED and outcome == "cancelled", world_size=first.get("world_size"))


def _markers(attempt: Attempt, previous_world_size: int | None) -> list[Marker]:
    """An attempt's start (``resume on 1 rank`` where it continued on another world size), then its end."""
    label: str = attempt.launch
    ranks = attempt.world_size
    if previous_world_size is not None and ranks is not None and ranks != previous_world_size:
        label = f"{attempt.launch} on {ranks} rank{'s' if ranks != 1 else ''}"
    markers = [Marker(attempt.start_step, attempt.launch, attempt.number, label)]
    if attempt.end == EventKind.STOPPED:
        stop = "cancel" if attempt.cancelled else "stop"
        step = attempt.end_step if attempt.end_step is not None else attempt.last_step  # a stop that names no step
        markers.append(Marker(step, "stop", attempt.number, f"{stop} ({attempt.stop_signal})"))
    elif attempt.end == "killed":
        markers.append(Marker(attempt.last_step, "killed", attempt.number, "killed"))
    elif attempt.end == EventKind.FAILED:
        markers.append(Marker(attempt.end_step or attempt.last_step, "failed", attempt.number,
                              f"failed ({attempt.failure})"))
    return markers


def build_timeline(events: Iterable[Mapping[str, Any]], *, launches: Sequence[str | None] | None = None,
                   outcomes: Sequence[str | None] | None = None,
                   failures: Sequence[str | None] | None = None) -> Timeline:
    """Derive attempts, markers and per-metric kept/lost series from a run's events. Any process.

    ``launches`` (optional) says how each start event came about, in order: ``"requeue"`` marks a
    relaunch by the launcher (``elfes plot`` reads it from ``state.json``); without it every
    ``resumed`` event is a ``resume``. ``outcomes`` (optional) says how the launcher recorded each
    attempt's end: ``"cancelled"`` marks a stop as a cancel. ``failures`` (optional) names each failed
    attempt's cause as the launcher recorded it (``"RuntimeError, retried"``; None for others): the
    failure marker says that, and an attempt killed for a hang is drawn as a failure.

    Example:
        >>> events = [{"event": "started", "state": {"step": 0}},
        ...           {"event": "train", "step": 5, "metrics": {"loss": 0.9}},
        ...           {"event": "train", "step": 10, "metrics": {"loss": 0.8}},
        ...           {"event": "resumed", "state": {"step": 5}},
        ...           {"event": "train", "step": 10, "metrics": {"loss": 0.7}}]
        >>> timeline = build_timeline(events)
        >>> timeline.series["train/loss"].kept_steps, [p.step for p in timeline.series["train/loss"].lost[0]]
        ((5, 10), [10])
        >>> [(m.kind, m.step) for m in timeline.markers]
        [('start', 0), ('killed', 10), ('resume', 5)]
    """
    builder = TimelineBuilder()
    for event in events:
        builder.add(event)
    return builder.build(launches=launches, outcomes=outcomes, failures=failures)
