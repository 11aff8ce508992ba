"""Where a run's hours went: its wall time split into parts, and its goodput (useful training / wall time).

:func:`account_goodput` is a pure function of what a run already records: when each attempt was launched
and ended and when the run was handed over (the launcher's ``state.json``), and what each start of the
training loop says of its time (:class:`~elfes.records.timings.AttemptTimes`, the running totals of
``events.jsonl``). The run's wall time runs from its first hand-over (or its first launch) to the end of
its last attempt, or to ``now`` while it is under way, and is cut into consecutive windows, one per
attempt: from the end of the attempt before (or the run's start) to the end of this one. Each window is
split into :class:`TimeParts`:

- ``between_s``: from the end of the attempt before to the next hand-over (or launch, when none came):
  a requeued job waiting to come back, a stopped run waiting for ``elfes resume``;
- ``queue_s``: from a hand-over (``elfes submit``, ``resume``, a resubmission) to the launch it led to; where
  SLURM's accounting says when the scheduler let the job start (``sacct``'s ``Eligible``: after a requeue, once
  its ``BeginTime`` hold passed), from the later of the two: the time spent waiting for resources. The
  time before it is ``between_s``;
- ``startup_s``: from the launch to the training loop's start record (``started``/``resumed``: imports,
  process group, data, the restore); an attempt that never wrote one spent all of its time starting up;
- ``useful_s`` and ``redone_s``: the training time (``train_s`` of the attempt's ``finished``/``stopped``
  record; for a loop killed or still running, the time from its start record to its last record, less
  its evaluations and checkpoint stalls), split by steps: the steps a later attempt trained again (past the
  step that later attempt resumed from: a kill or failure after the last checkpoint) are redone, the
  others useful. Steps are taken as equally long within an attempt;
- ``evaluation_s``: the evaluations' ``duration_s``;
- ``checkpoint_s``: the checkpoint stalls: a synchronous save whole, the blocked part (``blocked_s``:
  the copy, and the wait for the previous write) of an asynchronous one;
- ``other_s``: the rest of the attempt: logging, shutdown after the end record, and for an attempt killed
  without an end record, nothing after its last record (the kill is not recorded: the window ends there
  and the time until the next hand-over or launch is ``between_s``); for the attempt under way, the time
  since its last record.

The parts add up to the window, the windows to the wall time. Torch-free and rich-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from .timings import AttemptTimes

PART_LABELS: dict[str, str] = {
    "useful_s": "useful training",
    "redone_s": "redone",
    "evaluation_s": "evaluation",
    "checkpoint_s": "checkpoint stalls",
    "startup_s": "start-up",
    "queue_s": "queue",
    "between_s": "between attempts",
    "other_s": "other",
}
"""Each part's name for people, in the order status and plot show them."""


@dataclass(frozen=True)
class TimeParts:
    """Seconds of a span of a run's wall time, by what they went to (the module's docstring says how each is
    measured). ``total_s`` is their sum: the span."""

    useful_s: float = 0.0
    redone_s: float = 0.0
    evaluation_s: float = 0.0
    checkpoint_s: float = 0.0
    startup_s: float = 0.0
    queue_s: float = 0.0
    between_s: float = 0.0
    other_s: float = 0.0

    @property
    def total_s(self) -> float:
        return math.fsum(getattr(self, part.name) for part in fields(self))

    def __add__(self, other: TimeParts) -> TimeParts:
        return TimeParts(**{part.name: getattr(self, part.name) + getattr(other, part.name) for part in fields(self)})


@dataclass(frozen=True)
class AttemptGoodput:
    """One window of the run: attempt ``number`` (None for the wait after the last attempt) from ``begins_at``
    (the end of the attempt before, or the run's start) to ``ends_at``; ``redone_steps`` its steps trained again
    by a later attempt."""

    number: int | None
    begins_at: str
    ends_at: str
    parts: TimeParts
    redone_steps: int = 0


@dataclass(frozen=True)
class Goodput:
    """A run's (or a sweep's, summed) wall time, its parts and its attempts' windows; ``as_of`` is the
    end of the accounting (the last attempt's end, or the time it was asked while the run is under way)."""

    wall_s: float
    parts: TimeParts
    redone_steps: int
    attempts: tuple[AttemptGoodput, ...] = ()
    as_of: str | None = None

    @property
    def goodput(self) -> float | None:
        """Useful training over the wall time; None before any time passed."""
        return self.parts.useful_s / self.wall_s if self.wall_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["goodput"] = self.goodput
        return data


@dataclass(frozen=True)
class LaunchTimes:
    """What the launcher recorded of one attempt: its number, launch and end (None when it recorded none: the
    attempt is under way, or was lost); and when the scheduler let it start (``sacct``'s ``Eligible``), where
    known."""

    number: int
    launched_at: datetime
    ended_at: datetime | None = None
    eligible_at: datetime | None = None


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _seconds(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds()


@dataclass(frozen=True)
class _Loop:
    """One start of the training loop, measured: its times and the split of its training by steps."""

    start: datetime
    last: datetime
    training_s: float
    evaluation_s: float
    checkpoint_s: float
    redone_steps: int
    redone_s: float


def _loops(records: Sequence[AttemptTimes]) -> list[_Loop]:
    loops = []
    for index, record in enumerate(records):
        start, last = _time(record.start_time), _time(record.last_time)
        if record.totals is not None:
            training = record.totals["train_s"]
            evaluation, checkpoint = record.totals["evaluation_s"], record.totals["checkpoint_s"]
        else:  # killed, failed or running: what its records span, less what they say went elsewhere
            evaluation, checkpoint = record.evaluation_s, record.checkpoint_s
            training = max(0.0, _seconds(start, last) - evaluation - checkpoint)
        # Its steps past the lowest step a later start resumed from were trained again (timeline.py's lost span).
        redo_from = min((later.start_step for later in records[index + 1:]), default=None)
        trained = record.last_step - record.start_step
        redone = 0 if redo_from is None else max(0, record.last_step - max(redo_from, record.start_step))
        redone_s = training * redone / trained if trained > 0 else 0.0
        loops.append(_Loop(start, last, training, evaluation, checkpoint, redone, redone_s))
    return loops


def account_goodput(launches: Sequence[LaunchTimes], handovers: Sequence[datetime], records: Sequence[AttemptTimes],
                    *, now: datetime | None = None) -> Goodput:
    """Split a run's wall time into :class:`TimeParts` per attempt (see the module). Any process; pure.

    ``launches``: the attempts the launcher recorded, in order (empty for a run that no launcher started: each
    start of the training loop is then an attempt launched at its start record and ended at its end record).
    ``handovers``: the times the run was handed over to an executor and got a job, in order. ``records``: the
    running totals of the run records (:func:`~elfes.records.timings.timings_of_events`). ``now``: the time of
    the accounting while the run is under way (an attempt running, or a job waiting to start); None once it
    ended.

    Example:
        >>> from elfes.records.timings import timings_of_events
        >>> events = [{"event": "started", "time": "2026-01-01T00:00:00+00:00", "state": {"step": 0}},
        ...           {"event": "finished", "time": "2026-01-01T00:01:40+00:00", "state": {"step": 10},
        ...            "train_s": 80.0, "evaluation_s": 10.0, "checkpoint_s": 5.0, "wall_s": 100.0}]
        >>> run = account_goodput([], [], timings_of_events(events).attempts)
        >>> run.wall_s, run.parts.useful_s, run.parts.other_s, run.goodput
        (100.0, 80.0, 5.0, 0.8)
    """
    records = list(records)
    loops = _loops(records)
    if not launches:  # a run without a launcher: each start of the loop is an attempt
        launches = [LaunchTimes(number, loop.start, _time(record.end_time) if record.end_time else None)
                    for number, (loop, record) in enumerate(zip(loops, records), start=1)]
    if not launches and not handovers:
        return Goodput(wall_s=0.0, parts=TimeParts(), redone_steps=0)
    # Each start of the loop belongs to the latest attempt launched before it.
    owned: list[list[_Loop]] = [[] for _ in launches]
    for loop in loops:
        owned[max((i for i, launch in enumerate(launches) if launch.launched_at <= loop.start), default=0)].append(loop)
    begin = min([*handovers[:1], *(launch.launched_at for launch in launches[:1])])
    cursor, windows = begin, []
    for index, launch in enumerate(launches):
        under_way = now is not None and index == len(launches) - 1 and launch.ended_at is None
        end = now if under_way else launch.ended_at
        if end is None:  # lost without a recorded end: its window ends at its last record
            end = max([launch.launched_at, *(loop.last for loop in owned[index])])
        windows.append(_window(launch, cursor, end, owned[index], handovers))
        cursor = end
    if now is not None and (not launches or launches[-1].ended_at is not None) and now > cursor:
        windows.append(_window(None, cursor, now, [], handovers))  # the wait for the next attempt
        cursor = now
    parts = sum((window.parts for window in windows), TimeParts())
    return Goodput(wall_s=_seconds(begin, cursor), parts=parts, redone_steps=sum(w.redone_steps for w in windows),
                   attempts=tuple(windows), as_of=cursor.isoformat())


def _window(launch: LaunchTimes | None, begins: datetime, ends: datetime, loops: list[_Loop],
            handovers: Sequence[datetime]) -> AttemptGoodput:
    """The parts of one attempt's window (``launch`` None: the wait after the last attempt, up to ``ends``):
    waits before its launch, then the attempt itself."""
    number, launched = (launch.number, launch.launched_at) if launch is not None else (None, ends)
    eligible = launch.eligible_at if launch is not None else None
    queued = max((at for at in (*handovers, eligible) if at is not None and begins <= at <= launched), default=None)
    between = _seconds(begins, queued if queued is not None else launched)
    queue = _seconds(queued, launched) if queued is not None else 0.0
    span = _seconds(launched, ends)
    if number is None:
        return AttemptGoodput(None, begins.isoformat(), ends.isoformat(), TimeParts(queue_s=queue, between_s=between))
    if not loops:  # it never reached the training loop's start record
        parts = TimeParts(startup_s=span, queue_s=queue, between_s=between)
        return AttemptGoodput(number, begins.isoformat(), ends.isoformat(), parts)
    startup = _seconds(launched, loops[0].start)
    useful = math.fsum(loop.training_s - loop.redone_s for loop in loops)
    redone = math.fsum(loop.redone_s for loop in loops)
    evaluation = math.fsum(loop.evaluation_s for loop in loops)
    checkpoint = math.fsum(loop.checkpoint_s for loop in loops)
    other = span - startup - useful - redone - evaluation - checkpoint
    parts = TimeParts(useful_s=useful, redone_s=redone, evaluation_s=evaluation, checkpoint_s=checkpoint,
                      startup_s=startup, queue_s=queue, between_s=between, other_s=other)
    return AttemptGoodput(number, begins.isoformat(), ends.isoformat(), parts, sum(loop.redone_steps for loop in loops))


def sum_goodputs(runs: Sequence[Goodput]) -> Goodput:
    """A sweep's goodput: its members' wall times and parts summed (their attempts are not kept).

    Example:
        >>> one = Goodput(wall_s=10.0, parts=TimeParts(useful_s=6.0, other_s=4.0), redone_steps=1)
        >>> sum_goodputs([one, one]).goodput
        0.6
    """
    parts = sum((run.parts for run in runs), TimeParts())
    return Goodput(wall_s=math.fsum(run.wall_s for run in runs), parts=parts,
                   redone_steps=sum(run.redone_steps for run in runs))


def format_duration(seconds: float) -> str:
    """A duration for people: ``42.0s``, ``3m05s``, ``2h07m``.

    Example:
        >>> format_duration(42.04), format_duration(185), format_duration(7620)
        ('42.0s', '3m05s', '2h07m')
    """
    if abs(seconds) < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if abs(whole) < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def format_goodput(goodput: Goodput) -> str:
    """The goodput and its parts in one line (parts that took no time left out).

    Example:
        >>> print(format_goodput(Goodput(wall_s=100.0, parts=TimeParts(useful_s=80.0, other_s=20.0), redone_steps=0)))
        goodput 80.0% of 1m40s: useful training 1m20s, other 20.0s
    """
    share = goodput.goodput
    head = f"goodput {'-' if share is None else f'{share:.1%}'} of {format_duration(goodput.wall_s)}"
    shown = []
    for name, label in PART_LABELS.items():
        seconds = getattr(goodput.parts, name)
        if seconds == 0:
            continue
        steps = f" ({goodput.redone_steps} steps)" if name == "redone_s" else ""
        shown.append(f"{label} {format_duration(seconds)}{steps}")
    return head + (": " + ", ".join(shown) if shown else "")
