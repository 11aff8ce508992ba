"""A run's output as it grows: its log files (``elfes logs``, ``--follow``) and its run records
(``elfes submit --follow``). Reads files only; the followers poll until the run ends.

Torch-free.
"""

from __future__ import annotations

import codecs
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elfes.records.reader import events_of_bytes

from ..rundir import state as run_state
from ..rundir.liveness import LivenessProbe, effective_state, liveness
from ..rundir.lookup import UsageError, run_paths
from ..rundir.paths import RunPaths
from ..rundir.state import Outcome


@dataclass(frozen=True)
class LogFiles:
    attempt: int | None
    rank: int
    files: list[Path]  # stdout then stderr, those that exist (then submitit's own, for an attempt that was lost)
    ending: str | None = None  # "attempt 2 ended lost: <why>" for an attempt that ended with an error


def _latest_attempt(paths: RunPaths, state: run_state.RunState | None) -> int | None:
    numbers = [attempt.number for attempt in state.attempts] if state is not None else []
    if paths.logs.is_dir():
        numbers += [int(p.name.split("-")[1]) for p in paths.logs.glob("attempt-*") if p.name.split("-")[1].isdigit()]
    return max(numbers) if numbers else None


def _readable_state(paths: RunPaths) -> tuple[run_state.RunState | None, str | None]:
    """The run's state as the readers see it (a vanished job's attempt closed as lost), or None and
    why state.json cannot be read: the logs are shown either way."""
    try:
        state = run_state.load_state(paths)
    except run_state.RunDamaged as error:
        return None, str(error)
    if state is not None and state.last_attempt is not None and not state.last_attempt.ended:
        state = effective_state(paths, state, liveness(paths, state))
    return state, None


def _ending(attempt: run_state.Attempt | None) -> str | None:
    if attempt is None or not attempt.ended or not attempt.error:
        return None
    return f"attempt {attempt.number} ended {attempt.outcome}: {attempt.error}"


def log_files(run_dir: str | os.PathLike[str], *, rank: int | None = None, attempt: int | None = None) -> LogFiles:
    """The stdout and stderr files of ``rank`` in ``attempt`` (the latest by default), and how that
    attempt ended when it ended with an error. ``rank`` None: the rank whose failure ended the attempt (the cause
    state.json records), else 0. Reads files (and, for an attempt still open, its liveness)."""
    paths = run_paths(run_dir)
    state, unreadable = _readable_state(paths)
    return _files_of(paths, state, unreadable, rank=rank, attempt=attempt)


def _files_of(paths: RunPaths, state: run_state.RunState | None, unreadable: str | None, *, rank: int | None,
              attempt: int | None) -> LogFiles:
    """:func:`log_files` of the run's ``state`` as read (``unreadable``: why it could not be)."""
    latest = _latest_attempt(paths, state)
    if attempt is not None and (attempt < 1 or latest is None or attempt > latest):
        known = "no attempt yet" if not latest else "attempt 1 only" if latest == 1 else f"attempts 1-{latest}"
        raise UsageError(f"--attempt {attempt}: {paths.run_dir} has {known}; give one of them, or leave out "
                         "--attempt for the latest")
    if attempt is None:
        attempt = latest
    recorded = next((a for a in state.attempts if a.number == attempt), None) if state is not None else None
    if rank is None:
        failed = recorded.failure.rank if recorded is not None and recorded.failure is not None else None
        rank = failed if failed is not None else 0
    if rank < 0 or (state is not None and state.attempts and rank >= max(a.world_size for a in state.attempts)):
        size = max(a.world_size for a in state.attempts) if state is not None and state.attempts else 1
        raise UsageError(f"--rank {rank}: the job has ranks 0-{size - 1}; give one of them")
    files: list[Path] = []
    if attempt is not None:
        files = [paths.rank_log(attempt, rank, stream) for stream in ("out", "err")]
        files = [file for file in files if file.is_file()]
    if recorded is not None and recorded.outcome == Outcome.LOST:
        # What the task printed where its rank logs could not take it (a full disk), or before they existed.
        files += [file for file in (paths.submitit_log(recorded.job_id, rank, stream) for stream in ("out", "err"))
                  if file.is_file() and file.stat().st_size and file not in files]
    if not files and state is not None and state.job_id is not None:
        # Before the runtime redirects its streams (or when it could not start), submitit's own logs.
        files = [file for file in (paths.submitit_log(state.job_id, rank, "out"),
                                   paths.submitit_log(state.job_id, rank, "err")) if file.is_file()]
    if not files and paths.controller_log.is_file():
        files = [paths.controller_log]
    return LogFiles(attempt=attempt, rank=rank, files=files, ending=unreadable or _ending(recorded))


def follow_logs(run_dir: str | os.PathLike[str], *, rank: int | None = None, interval_s: float = 0.5) -> Iterator[tuple[Path, str]]:
    """Yield ``(file, new text)`` from the latest attempt's logs of ``rank`` until the run ends,
    moving on to each new attempt's files, and last ``(state.json, how the attempt ended)`` when it
    ended with an error. The caller stops whenever it likes."""
    paths = run_paths(run_dir)
    offsets: dict[Path, int] = {}
    decoders: dict[Path, codecs.IncrementalDecoder] = {}
    probe = LivenessProbe(paths)
    while True:
        state = run_state.load_state(paths)
        state = effective_state(paths, state, probe(state))
        ended = state is None or state.status in run_state.ENDED  # read once more after the end, then stop
        # The state just read (its liveness asked through the probe): no squeue of its own each pass.
        for file in _files_of(paths, state, None, rank=0 if rank is None else rank, attempt=None).files:
            decoder = decoders.setdefault(file, codecs.getincrementaldecoder("utf-8")(errors="replace"))
            with open(file, "rb") as stream:  # in chunks: a 200 MB log is never held whole
                stream.seek(offsets.get(file, 0))
                while data := stream.read(1 << 20):
                    offsets[file] = offsets.get(file, 0) + len(data)
                    if text := decoder.decode(data):
                        yield file, text
        if ended:
            ending = _ending(state.last_attempt) if state is not None else None
            if ending is not None:
                yield paths.state, f"elfes: {ending}\n"
            return
        time.sleep(interval_s)


class EventTail:
    """New complete lines of a run's ``events.jsonl`` since the last call (a torn last line waits)."""

    def __init__(self, paths: RunPaths, *, from_start: bool = True) -> None:
        self.file = paths.events
        self.offset = 0
        if not from_start and self.file.is_file():
            self.offset = self.file.stat().st_size  # only what is written from now on

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.file, "rb") as stream:
                stream.seek(self.offset)
                data = stream.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return events_of_bytes(data[:end])


@dataclass(frozen=True)
class Snapshot:
    """One look at a followed run: the events written since the previous look, and its state."""

    events: list[dict[str, Any]]
    state: run_state.RunState | None
    queue_state: str | None
    ended: bool


def watch(run_dir: str | os.PathLike[str], *, from_start: bool = True, interval_s: float = 0.5) -> Iterator[Snapshot]:
    """Snapshots of a run until it ends (its last snapshot has ``ended`` true). Reads files only.
    ``from_start``: replay the run records already written (else only new ones)."""
    paths = run_paths(run_dir)
    tail = EventTail(paths, from_start=from_start)
    probe = LivenessProbe(paths)
    while True:
        state = run_state.load_state(paths)
        live = probe(state)
        state = effective_state(paths, state, live)
        ended = state is not None and state.status in run_state.ENDED
        yield Snapshot(tail.read(), state, live.queue_state, ended)
        if ended:
            return
        time.sleep(interval_s)
