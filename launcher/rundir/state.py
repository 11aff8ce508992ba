"""``state.json``: where a run is, its submissions and attempts. Torch-free. Three modules, one room:

- launcher/rundir/state_records.py: the records (:class:`RunState`, :class:`Attempt`, ...) and their words
  (:class:`RunStatus`, :class:`Outcome`, :class:`Launch`);
- launcher/rundir/state_transitions.py: the state machine, pure functions ``RunState -> RunState``;
- this module: reading and writing the file. Callers import all three's names from here
  (``from ..rundir import state as run_state``).

Two kinds of process write it, each through :func:`update_state` (a read-modify-write under an
``fcntl.flock`` on ``RunPaths.state_lock``, published with ``elfes.files.write_text_atomically``):
the submitter (``elfes submit``/``resume``/``cancel``, and a local job's rank 0 when it resubmits past
submitit's six starts) and rank 0 of the job (attempt begins, stops, ends). Readers (``elfes status``)
use :func:`load_state` and never lock; a file they cannot read raises :class:`RunDamaged`.

>>> paths = RunPaths(run_dir)  # doctest: +SKIP
>>> update_state(paths, lambda s: record_submission(s, executor="local", kind="submit", max_requeues=20))  # doctest: +SKIP
>>> update_state(paths, lambda s: mark_pending(s, job_id="4242"))  # doctest: +SKIP
>>> state = load_state(paths)  # doctest: +SKIP
>>> state.status, state.requeues_used, state.requeues_left  # doctest: +SKIP
('pending', 0, 20)
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from elfes.files import exclusive_lock, write_text_atomically

from ..errors import NotNow, RunDamaged
from .paths import RunPaths, SweepPaths
from .state_records import (
    ENDED,
    FAILURE_CATEGORIES,
    FORMAT_VERSION,
    LAUNCHES,
    OUTCOMES,
    STATUSES,
    Attempt,
    ExcludedNode,
    Failure,
    FailureCategory,
    Launch,
    Outcome,
    RunState,
    RunStatus,
    Submission,
    now,
)
from .state_transitions import (
    attempt_number,
    begin_attempt,
    cancel_between_attempts,
    end_attempt,
    exclude_nodes,
    failures_used_by,
    include_nodes,
    include_nodes_after,
    latest_submission_kind,
    lift_exclusions,
    mark_lost,
    mark_pending,
    mark_stopping,
    mark_submission_abandoned,
    mark_submission_failed,
    previous_attempt,
    record_provenance,
    record_rank_place,
    record_submission,
    refuse_retry,
    requeued_by_slurm,
    requeues_used_by,
    token_restart,
)

__all__ = [
    "ENDED", "FAILURE_CATEGORIES", "FORMAT_VERSION", "LAUNCHES", "OUTCOMES", "STATUSES", "Attempt", "ExcludedNode",
    "Failure", "FailureCategory", "Launch", "NotNow", "Outcome", "RunDamaged", "RunState", "RunStatus", "Submission", "attempt_number",
    "begin_attempt", "cancel_between_attempts", "end_attempt", "exclude_nodes", "failures_used_by", "include_nodes",
    "include_nodes_after", "latest_submission_kind", "lift_exclusions", "load_state", "mark_lost", "mark_pending",
    "mark_stopping", "mark_submission_abandoned", "mark_submission_failed", "now", "previous_attempt",
    "record_provenance", "record_rank_place", "record_submission", "refuse_retry", "requeued_by_slurm",
    "requeues_used_by", "save_state", "token_restart", "update_state",
]


def load_state(paths: RunPaths) -> RunState | None:
    """The run's state, or None when ``state.json`` does not exist yet. Any process; takes no lock.
    A file that cannot be read raises :class:`RunDamaged`: the file, what is wrong, a safe repair. So does a
    ``state.json`` that is not a regular file (a dangling symbolic link, a folder, a pipe): it is not a run
    that never started."""
    try:
        info = paths.state.stat()
    except FileNotFoundError:
        if not paths.state.is_symlink():
            return None
        raise RunDamaged(f"{paths.state} cannot be read: it is a symbolic link to {os.readlink(paths.state)}, which "
                         f"does not exist (elfes writes state.json as a regular file). {_repair(paths)}") from None
    except OSError as error:
        raise RunDamaged(f"{paths.state} cannot be read ({error.strerror or error}); check it and its permissions") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise RunDamaged(f"{paths.state} cannot be read: it is {kind} (elfes writes state.json as a regular file). "
                         f"{_repair(paths)}")
    try:
        content = paths.state.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise RunDamaged(f"{paths.state} cannot be read ({error.strerror or error}); check it and its permissions") from None
    try:
        return RunState.from_json(json.loads(content.decode("utf-8")))
    except RunDamaged as error:
        raise RunDamaged(f"{paths.state} {error}") from None
    except ValueError as error:  # not UTF-8, not JSON, or a field that does not fit (FieldError)
        raise RunDamaged(
            f"{paths.state} cannot be read: {error}. It is written atomically, so it was edited or damaged outside "
            f"elfes. {_repair(paths)}") from None


def _repair(paths: RunPaths) -> str:
    """The safe repair of a damaged ``state.json``: moved aside, the run handed over again; a sweep member's by
    the sweep (its job.yaml submitted alone would run outside the sweep's scheduling and ``max_parallel``)."""
    sweep = SweepPaths(paths.run_dir.parent)
    again = (f"resume the sweep (elfes resume {sweep.sweep_dir}), which hands this member over again"
             if sweep.record.is_file() else f"submit again (elfes submit {paths.spec})")
    return ("Keep the run directory (its checkpoints are intact): once no job of the run is running, move the file "
            f"aside (mv {paths.state} {paths.state}.damaged) and {again}; the run continues from checkpoints/last, its "
            "attempt history started anew.")


def save_state(paths: RunPaths, state: RunState) -> None:
    """Publish ``state`` atomically. Prefer :func:`update_state`, which also serialises writers."""
    write_text_atomically(paths.state, json.dumps(state.to_json(), indent=2) + "\n")


@contextmanager
def _locked(paths: RunPaths) -> Iterator[None]:
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(paths.state_lock):
        yield


def update_state(paths: RunPaths, change: Callable[[RunState | None], RunState]) -> RunState:
    """Load, apply ``change`` (a transition) and save, holding the run's state lock. Returns the new state.

    Submitter and rank 0 only. Nothing is written when ``change`` raises or returns the state unchanged.
    """
    with _locked(paths):
        before = load_state(paths)
        after = change(before)
        if after is not before:
            save_state(paths, after)
        return after


def update_recorded_state(paths: RunPaths, change: Callable[[RunState], RunState]) -> RunState:
    """:func:`update_state` for a run that must have a ``state.json`` (the job's own records): RunDamaged, naming
    the file, when it is gone."""

    def changed(state: RunState | None) -> RunState:
        if state is None:
            raise RunDamaged(f"{paths.state} is missing: the run's record of its attempts is gone; nothing can be "
                             "recorded in it. Submit the job again into a new run_dir (--set run_dir=NEW_FOLDER)")
        return change(state)

    return update_state(paths, changed)

