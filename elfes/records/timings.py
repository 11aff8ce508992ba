"""Where each start of the training loop spent its time, as running totals of the run records.

:class:`RunTimings` takes a run's events one at a time (oldest first) and keeps, per start of the
training loop (a ``started`` or ``resumed`` event), a constant-size :class:`AttemptTimes`: when it
started and at which step, its last record and highest step, the seconds of its evaluations
(``evaluation.duration_s``) and of its checkpoint stalls (``checkpoint.blocked_s``, or ``duration_s``
in records older than that field), and the totals of its ``finished``/``stopped`` event where it has one.

The main process's :class:`~elfes.records.RunLogger` keeps these totals while it writes ``events.jsonl``
and publishes them in ``timings.json`` beside it after every event whose fields they sum (a start, an
evaluation, a checkpoint, an end: atomically, with the size of ``events.jsonl`` they cover; after it come
only events that move the last record and step, such as ``train``), so that ``elfes status`` of a run with a million events reads
that small file and the last train records after it, never the whole log (:mod:`elfes.records.goodput`
turns them into the run's goodput). Without the file (an older run) the totals are those of
:func:`timings_of_events` over the whole log.

Torch-free and rich-free.

Example:
    >>> timings = RunTimings()
    >>> for event in [{"event": "started", "time": "2026-01-01T00:00:00+00:00", "state": {"step": 0}},
    ...               {"event": "evaluation", "time": "2026-01-01T00:00:09+00:00", "step": 4, "duration_s": 2.0}]:
    ...     timings.add(event)
    >>> timings.attempts[0].last_step, timings.attempts[0].evaluation_s
    (4, 2.0)
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from elfes.contract import END_EVENTS, START_EVENTS, TIMINGS_FILE_NAME, EventKind
from elfes.files import temporary_name

from .reader import events_of_bytes, iter_events

TIMINGS_VERSION = 1
_TOTALS = ("train_s", "evaluation_s", "checkpoint_s", "wall_s")
# The events whose fields the totals sum: the totals are published after each (the others only move the last
# record's time and step, which a reader takes from the events after the published offset).
PUBLISHED_AFTER = (*START_EVENTS, *END_EVENTS, EventKind.EVALUATION, EventKind.CHECKPOINT)


def timings_path(run_dir: Path) -> Path:
    """The running totals' file of a run directory (``RunPaths.timings``)."""
    return Path(run_dir) / TIMINGS_FILE_NAME


@dataclass
class AttemptTimes:
    """What one start of the training loop's records say of its time (times are the records' UTC ISO stamps).

    ``end`` is the event that ended it (finished, stopped or failed; None for a loop killed or still
    running) and ``totals`` the phase totals a finished or stopped event carries (train_s, evaluation_s,
    checkpoint_s, wall_s since the start).
    """

    start_time: str
    start_step: int
    last_time: str
    last_step: int
    evaluation_s: float = 0.0
    checkpoint_s: float = 0.0
    end: str | None = None
    end_time: str | None = None
    totals: dict[str, float] | None = None


@dataclass
class RunTimings:
    """The running totals of a run's records: one :class:`AttemptTimes` per start event, and ``offset``, the
    bytes of ``events.jsonl`` they cover (set by the writer that publishes them)."""

    attempts: list[AttemptTimes] = field(default_factory=list)
    offset: int = 0

    def add(self, event: Mapping[str, Any]) -> None:
        """Take the run's next event. Events before the first start, and events without a time, add nothing."""
        kind, time = event.get("event"), event.get("time")
        if not isinstance(time, str):
            return
        step = _step(event)
        if kind in START_EVENTS:
            start = step if step is not None else 0
            self.attempts.append(AttemptTimes(start_time=time, start_step=start, last_time=time, last_step=start))
            return
        if not self.attempts:
            return
        attempt = self.attempts[-1]
        attempt.last_time = time
        if step is not None and step > attempt.last_step:
            attempt.last_step = step
        if kind == EventKind.EVALUATION:
            attempt.evaluation_s += _seconds(event.get("duration_s"))
        elif kind == EventKind.CHECKPOINT:
            blocked = event.get("blocked_s")
            attempt.checkpoint_s += _seconds(blocked if blocked is not None else event.get("duration_s"))
        elif kind in END_EVENTS:
            attempt.end, attempt.end_time = kind, time
            if kind != EventKind.FAILED:
                attempt.totals = {key: _seconds(event.get(key)) for key in _TOTALS}

    def state_dict(self) -> dict[str, Any]:
        return {"version": TIMINGS_VERSION, "offset": self.offset, "attempts": [asdict(a) for a in self.attempts]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take the content of a ``timings.json``; ``ValueError`` names what does not fit (the caller then
        rebuilds the totals from ``events.jsonl``)."""
        if not isinstance(state, Mapping) or state.get("version") != TIMINGS_VERSION:
            raise ValueError(f"not a version-{TIMINGS_VERSION} timings record")
        offset, attempts = state.get("offset"), state.get("attempts")
        if type(offset) is not int or offset < 0 or not isinstance(attempts, list):
            raise ValueError("offset must be an integer >= 0 and attempts a list")
        try:
            loaded = [AttemptTimes(**attempt) for attempt in attempts]
        except TypeError as error:
            raise ValueError(f"an attempt does not fit: {error}") from error
        self.attempts, self.offset = loaded, offset


def _step(event: Mapping[str, Any]) -> int | None:
    step = event.get("step")
    if _is_integer(step):
        return int(step)
    state = event.get("state")
    step = state.get("step") if isinstance(state, Mapping) else None
    return int(step) if _is_integer(step) else None


def _is_integer(value: object) -> TypeGuard[numbers.Integral]:
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def _seconds(value: Any) -> float:
    """A duration field's seconds; 0 for a null (non-finite) or missing one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return 0.0
    return float(value)


def timings_of_events(events: Iterable[Mapping[str, Any]]) -> RunTimings:
    """The running totals of ``events`` (a whole run's, oldest first). Any process.

    Example:
        >>> timings_of_events([{"event": "started", "time": "T0", "state": {"step": 0}}]).attempts[0].start_step
        0
    """
    timings = RunTimings()
    for event in events:
        timings.add(event)
    return timings


def read_timings(run_dir: Path) -> RunTimings | None:
    """The totals ``timings.json`` holds, or None when there is none or it cannot be read (an older run, a
    file torn by hand): read the events then."""
    try:
        state = json.loads(timings_path(run_dir).read_text(encoding="utf-8"))
        timings = RunTimings()
        timings.load_state_dict(state)
    except (OSError, ValueError):
        return None
    return timings


class TimingsWriter:
    """The running totals that the main process's RunLogger keeps while it writes ``events.jsonl``:
    :meth:`open` picks up the published totals (rebuilding them from the events when the file is missing or
    does not match, and catching up with the events written after them, e.g. by a killed attempt),
    :meth:`add` takes each event written, and publishes the totals after those of :data:`PUBLISHED_AFTER`."""

    def __init__(self, run_dir: Path, events_file: Path) -> None:
        self.path = timings_path(run_dir)
        self.events_file = events_file
        self.timings = RunTimings()

    def open(self) -> None:
        size = self.events_file.stat().st_size if self.events_file.exists() else 0
        timings = read_timings(self.path.parent)
        if timings is None or timings.offset > size:
            timings, offset = RunTimings(), 0
        else:
            offset = timings.offset
        if offset < size:
            for event in _events_from(self.events_file, offset):
                timings.add(event)
        self.timings = timings
        self.timings.offset = size

    def add(self, event: Mapping[str, Any], time: str, size: int) -> None:
        """Take an event just written (stamped ``time``; ``size``: the events file's bytes after it)."""
        self.timings.add({**event, "time": time})
        self.timings.offset = size
        if event.get("event") in PUBLISHED_AFTER:
            # Replaced atomically but not synced: after a crash, a stale or missing file is rebuilt from the events.
            temporary = temporary_name(self.path)
            temporary.write_text(json.dumps(self.timings.state_dict()), encoding="utf-8")
            os.replace(temporary, self.path)


def _events_from(file: Path, offset: int) -> Iterable[Mapping[str, Any]]:
    """The events of ``file`` after byte ``offset`` (a line boundary the totals were published at)."""
    if offset == 0:
        return iter_events(file)
    with open(file, "rb") as stream:
        stream.seek(offset)
        data = stream.read()
    return events_of_bytes(data)


def events_file_size(file: Path) -> int:
    """The size of the events file in bytes (0 when it does not exist)."""
    try:
        return os.stat(file).st_size
    except OSError:
        return 0
