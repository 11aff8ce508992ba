"""Which checkpoint a start of an entrypoint job resumes from (``Job.resume_from``).

``checkpoints/last`` when it names a checkpoint of this run inside its checkpoint folder; the run's
newest complete checkpoint when a kill (or a hand) left ``last`` missing or dangling; None for a
run that has published no checkpoint yet. A ``last`` that leaves the run's checkpoint folder, or
names a checkpoint another run wrote, or a file that is not a checkpoint ELFES can load safely (a
pickle planted there), is refused: resuming from it would continue someone else's training under
this run's name, or run what the file names. The run's id is the one its latest ``started`` record carries (the engine
writes it into every checkpoint), else the one all of its complete checkpoints share.

Inside the job only: it reads checkpoint files through the engine (torch).
"""

from __future__ import annotations

from pathlib import Path

from elfes.contract import EventKind

from ..rundir.paths import RunPaths


def resume_point(paths: RunPaths) -> tuple[Path | None, str | None]:
    """The checkpoint to resume from (None: a fresh start) and a note when it is not ``last`` itself.

    Raises ``elfes.engine.checkpoint.CheckpointError`` for a ``last`` it must not trust, or when
    checkpoints exist and none of them is a complete one of this run.
    """
    from elfes.engine.checkpoint import CheckpointDirectory, CheckpointError, checkpoint_run_id, safe_load_problem

    last, folder = paths.last, paths.checkpoints
    directory = CheckpointDirectory(folder)
    run_id = _recorded_run_id(paths)
    if last.is_symlink() or last.exists():
        target = last.resolve()
        if target.parent != folder.resolve():
            raise CheckpointError(
                f"{last} points to {target}, outside this run's checkpoint folder {folder}: a run resumes only from "
                f"its own checkpoints. Point it at one of them (ln -sfn FILE {last}), or remove it to resume from the "
                "run's newest complete checkpoint; then `elfes resume` the run.")
        if target.exists():
            problem = safe_load_problem(target)
            if problem is not None:  # a file planted or damaged: nothing of it was loaded or run
                raise CheckpointError(
                    f"{last} points to {target.name}, which is not a checkpoint ELFES can load safely ({problem}); "
                    f"nothing of it was loaded. Point {last} at one of this run's checkpoints (ln -sfn FILE {last}), "
                    "or remove it to resume from the run's newest complete checkpoint; then `elfes resume` the run.")
            found = checkpoint_run_id(target)
            owner = run_id or _single(directory.run_ids() - {found})  # no records: the folder's other checkpoints
            if owner is not None and found != owner:
                raise CheckpointError(
                    f"{last} points to {target.name}, a checkpoint of run {found}, not of this run ({owner}). Point it "
                    f"at one of this run's checkpoints (ln -sfn FILE {last}), or remove it to resume from the run's "
                    "newest complete checkpoint; then `elfes resume` the run.")
            return last, None
    if not directory.checkpoints():
        if last.is_symlink():
            raise CheckpointError(
                f"{last} names {last.resolve().name}, which does not exist, and {folder} holds no checkpoint: nothing "
                f"to resume from. Restore the file, or remove {last} to train the run from its start.")
        return None, None  # nothing published yet: a fresh start
    if run_id is None:
        runs = directory.run_ids()
        if len(runs) > 1:
            raise CheckpointError(
                f"{last} is missing and {folder} holds checkpoints of {len(runs)} runs, and the run records "
                f"({paths.events}) name none: point {last} at the checkpoint to resume from (ln -sfn FILE {last}).")
    newest = directory.newest_complete(run_id=run_id)
    if newest is None:
        raise CheckpointError(
            f"{last} is missing and {folder} holds no complete checkpoint of this run"
            + (f" ({run_id})" if run_id else "") + f": nothing to resume from. Point {last} at a checkpoint to "
            f"resume from (ln -sfn FILE {last}), or move {folder} aside to train the run from its start.")
    state = f"names {last.resolve().name}, which does not exist" if last.is_symlink() else "does not exist"
    return newest, f"{last} {state}; resuming from {newest.name}, this run's newest complete checkpoint"


def _recorded_run_id(paths: RunPaths) -> str | None:
    """The run id of the run's latest ``started`` record, if its records hold one. A start is fresh only
    when no checkpoint was published, so a later ``started`` (a kill before the first checkpoint, then
    a relaunch) begins the run again under the id its checkpoints carry."""
    import warnings

    from elfes.records import read_events

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a line torn by a kill
        try:
            events = read_events(paths.run_dir)
        except (FileNotFoundError, ValueError):
            return None
    started = next((event for event in reversed(events) if event.get("event") == EventKind.STARTED), None)
    run_id = started.get("run_id") if started is not None else None
    return run_id if isinstance(run_id, str) else None


def _single(values: set[str | None]) -> str | None:
    return next(iter(values)) if len(values) == 1 else None
