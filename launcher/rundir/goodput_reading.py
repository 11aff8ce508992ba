"""A run's goodput from its files: the attempts and hand-overs of ``state.json`` and the running totals of
the run records (``timings.json``, and the events written after them), given to
:func:`elfes.records.goodput.account_goodput`.

Reads a bounded amount of ``events.jsonl`` whatever its size: ``timings.json`` is published after every
event whose fields the totals sum, so the events after its offset only move the last record's time and
step, which the last ``TAIL_BYTES`` of the file tell. A run without ``timings.json`` (written by an elfes
older than it) has its events read whole when the file is at most ``SCAN_BYTES``, else no goodput.
Torch-free; writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from elfes.records.goodput import Goodput, LaunchTimes, account_goodput
from elfes.records.reader import events_of_bytes
from elfes.records.timings import RunTimings, read_timings, timings_of_events

from ..backends import Executor, backend_for
from ..slurm import JobStart
from .paths import RunPaths
from .state import ENDED, Outcome, RunState
from .status_reading import TAIL_BYTES

SCAN_BYTES = 4 * 1024 * 1024  # a run without timings.json: read its events whole up to this size
CLOCK_SKEW_S = 60.0  # how far a compute node's clock may run behind the controller's, in matching a job's start


class NoTimings(ValueError):
    """The run has no running totals to read its goodput from (and its events are too many to read whole)."""


def run_timings(paths: RunPaths) -> RunTimings:
    """The running totals of the run's records, up to the last complete line of ``events.jsonl``."""
    try:
        size = os.stat(paths.events).st_size
    except OSError:
        return RunTimings()
    timings = read_timings(paths.run_dir)
    if timings is None or timings.offset > size:
        if size > SCAN_BYTES:
            raise NoTimings(f"{paths.timings} is missing or does not match {paths.events} ({size} bytes, written by "
                            "an older elfes?): the goodput is read from the next attempt on")
        import warnings

        from elfes.records import iter_events

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a line torn by a kill is no event
            return timings_of_events(iter_events(paths.events))
    if timings.offset < size:
        start = max(timings.offset, size - TAIL_BYTES)
        with open(paths.events, "rb") as stream:
            stream.seek(start)
            data = stream.read(size - start)
        if start > timings.offset:
            data = data[data.find(b"\n") + 1:]  # cut mid-line by the read's start
        for event in events_of_bytes(data):
            timings.add(event)
    return timings


def scheduled_job_starts(states: Iterable[RunState]) -> Mapping[str, tuple[JobStart, ...]]:
    """What each backend's scheduler recorded of the starts of the jobs of ``states`` (one ``sacct`` for SLURM's);
    nothing where it keeps no record or does not answer. Each backend is asked only for the jobs its submissions
    made (a run may have begun locally: a local job's id is no SLURM job's), an array task's by its array's id too."""
    job_ids: dict[Executor, set[str]] = {}
    for state in states:
        for executor in {submission.executor for submission in state.submissions}:
            submitted = {submission.job_id for submission in state.submissions
                         if submission.executor == executor and submission.job_id is not None}
            job_ids.setdefault(executor, set()).update(
                attempt.job_id for attempt in state.attempts
                if attempt.job_id in submitted or attempt.job_id.partition("_")[0] in submitted)
    starts: dict[str, tuple[JobStart, ...]] = {}
    for executor, ids in job_ids.items():
        starts.update(backend_for(executor).queue_starts(ids))
    return starts


def run_goodput(paths: RunPaths, state: RunState | None, now: datetime,
                starts: Mapping[str, tuple[JobStart, ...]] | None = None) -> Goodput:
    """The goodput of the run in ``paths`` as ``state`` (its effective state) records it, at ``now`` while
    the run is under way; ``starts``: :func:`scheduled_job_starts` of it (asked here when None). :class:`NoTimings`
    when its records cannot be read cheaply; ValueError for a time that cannot be read."""
    timings = run_timings(paths)
    launches, handovers = [], []
    if state is not None:
        starts = scheduled_job_starts([state]) if starts is None else starts
        for attempt in state.attempts:
            ended = attempt.ended_at if attempt.outcome != Outcome.LOST else None
            launched = datetime.fromisoformat(attempt.started_at)
            launches.append(LaunchTimes(attempt.number, launched, datetime.fromisoformat(ended) if ended is not None
                                        else None, _eligible_at(starts.get(attempt.job_id, ()), launched)))
        handovers = [datetime.fromisoformat(submission.at) for submission in state.submissions
                     if submission.job_id is not None]
    under_way = state is not None and state.status not in ENDED
    if state is None and timings.attempts:  # records without a launcher: under way unless the last loop ended
        under_way = timings.attempts[-1].end is None
    return account_goodput(launches, handovers, timings.attempts, now=now if under_way else None)


def _eligible_at(starts: tuple[JobStart, ...], launched: datetime) -> datetime | None:
    """When SLURM let start the job's start that launched the attempt recorded at ``launched``: the latest start
    before it (a task records its launch after SLURM started it; CLOCK_SKEW_S for hosts whose clocks differ)."""
    before = [start for start in starts
              if start.started_at is not None and start.started_at <= launched + timedelta(seconds=CLOCK_SKEW_S)]
    return max(before, key=lambda start: start.eligible_at).eligible_at if before else None
