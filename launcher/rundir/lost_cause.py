"""Why an attempt ended without recording its end, from what it left behind.

A job that cannot write ``state.json`` (its file system full or read-only) or that is killed (at its
time limit, by an operator, with its node) records no outcome. The readers (``elfes status``,
``logs``, ``submit --follow``) then name the cause from what remains: the last error the job printed
(its rank logs, submitit's per-task logs), the run directory's file system now, how long it lived
against its time limit, and the stop signal it was handling. Torch-free; reads only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from . import state as run_state
from .paths import RunPaths
from .task_files import LOG_LINE_PREFIX

GENERIC = "killed, or its node failed"
# Fewer bytes free than this and state.json (a few KiB, written beside itself and renamed) may not fit.
LOW_SPACE_BYTES = 64 * 1024
_TAIL_BYTES = 64 * 1024
# Within this much of the limit the attempt counts as having lived to it (task start vs. rank 0's record).
_LIMIT_SLACK_S = 5.0
_TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class PrintedError:
    """The last error a task of the attempt printed, and the file it is in."""

    message: str
    file: Path


def describe_lost(paths: RunPaths, state: run_state.RunState) -> str:
    """The error to record for the run's open attempt, which ended without recording an outcome."""
    return (f"the job ended without recording an outcome: {'; '.join(lost_causes(paths, state))}. "
            f"See `elfes logs {paths.run_dir}`")


def lost_causes(paths: RunPaths, state: run_state.RunState) -> list[str]:
    """What the files show of why the latest attempt ended unrecorded; ``[GENERIC]`` when nothing does."""
    attempt = state.last_attempt
    causes = []
    printed = last_printed_error(paths, attempt) if attempt is not None else None
    if printed is not None:
        causes.append(f"it failed with {printed.message} ({printed.file.relative_to(paths.run_dir)})")
    file_system = file_system_problem(paths)
    if file_system is not None:
        causes.append(f"{file_system}, so the job could not record its end in {paths.state.name} (free space or make "
                      "it writable, then `elfes resume` continues from `last`)")
    limit = time_limit_problem(paths, state) if attempt is not None else None
    if limit is not None:
        causes.append(limit)
    elif state.status == run_state.RunStatus.STOPPING and state.stopping_signal:
        causes.append(f"it was stopping on {state.stopping_signal} (saving `last`) when it ended: {GENERIC}")
    return causes or [GENERIC]


def last_printed_error(paths: RunPaths, attempt: run_state.Attempt) -> PrintedError | None:
    """The last exception (or elfes failure line) in the attempt's rank logs, else in submitit's own
    per-task logs of its job (what a task printed where the rank logs could not take it)."""
    ranks = range(max(attempt.world_size, 1))
    files = [paths.rank_log(attempt.number, rank, "err") for rank in ranks]
    files += [paths.submitit_log(attempt.job_id, rank, "err") for rank in ranks]
    for file in files:
        message = _last_error_in(_tail(file), attempt.number)
        if message is not None:
            return PrintedError(message, file)
    return None


def _tail(file: Path) -> str:
    try:
        with open(file, "rb") as stream:
            stream.seek(max(0, stream.seek(0, os.SEEK_END) - _TAIL_BYTES))
            return stream.read().decode(errors="replace")
    except OSError:
        return ""


def _last_error_in(text: str, attempt: int) -> str | None:
    # The runtime's line, after the time and level its logging puts first (LOG_LINE_FORMAT; none in logs
    # written before it logged).
    failures: list[str] = re.findall(rf"^(?:{LOG_LINE_PREFIX})?elfes: attempt {attempt} failed on rank \d+: (.+)$", text,
                          flags=re.MULTILINE)
    if failures:
        return failures[-1].strip()
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None
    # The exception line is the first unindented line after the frames of the last traceback.
    for line in text[start + len(_TRACEBACK):].splitlines():
        if line.strip() and not line[0].isspace():
            return line.strip()
    return None


def file_system_problem(paths: RunPaths) -> str | None:
    """"the file system of RUN_DIR is read-only" or "... is full (N KiB free)", or None."""
    try:
        found = os.statvfs(paths.run_dir)
    except OSError:
        return None
    if found.f_flag & os.ST_RDONLY:
        return f"the file system of {paths.run_dir} is read-only"
    free = found.f_bavail * found.f_frsize
    if free < LOW_SPACE_BYTES:
        return f"the file system of {paths.run_dir} is full ({free // 1024} KiB free)"
    return None


def time_limit_problem(paths: RunPaths, state: run_state.RunState) -> str | None:
    """"time limit (resources.timeout_min = N) reached ..." when the attempt lived to the spec's limit, else None."""
    from ..spec import SpecError
    from .lookup import recorded_limits

    attempt = state.last_attempt
    try:
        spec = recorded_limits(paths)  # these two sections only: a sweep's status asks it of every vanished member
    except SpecError:
        return None
    if spec is None or attempt is None:
        return None
    limit_s, delay_s = spec.resources.timeout_min * 60, spec.slurm.signal_delay_s
    lived_s = _last_sign_of_life(paths, state, attempt) - datetime.fromisoformat(attempt.started_at).timestamp()
    if lived_s < limit_s - _LIMIT_SLACK_S:
        return None
    stopping = state.stopping_signal if state.status == run_state.RunStatus.STOPPING else None
    return (f"time limit (resources.timeout_min = {spec.resources.timeout_min}) reached "
            + ("while stopping" if stopping else "before it saved `last`")
            + "; raise signal_delay_s or the limit. It was killed at its time limit after "
            f"{lived_s:.0f} s" + (f", while it was saving `last` on {stopping}" if stopping else "")
            + f": the requeue signal comes slurm.signal_delay_s = {delay_s} s before the limit, too little to end the "
            "window and save; raise slurm.signal_delay_s above the longest window plus a checkpoint save")


def _last_sign_of_life(paths: RunPaths, state: run_state.RunState, attempt: run_state.Attempt) -> float:
    """The latest moment ``attempt`` (the last) wrote something: its rank logs, the run records, its state updates."""
    moments = [datetime.fromisoformat(state.updated_at).timestamp()]
    files = [paths.events] + [paths.rank_log(attempt.number, rank, stream) for rank in range(max(attempt.world_size, 1))
                              for stream in ("out", "err")]
    for file in files:
        try:
            moments.append(file.stat().st_mtime)
        except OSError:
            pass
    return max(moments)
