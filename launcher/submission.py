"""The verbs that hand a run to an executor: ``elfes submit``, ``elfes resume``, and a local job's
requeue past submitit's start limit. Each records what it does in ``state.json`` (launcher/state.py)
under the run directory's submission lock.

Torch-free: ``submit`` and ``resume`` run on a login node.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from elfes.files import write_text_atomically

from . import executors
from . import state as run_state
from .liveness import cancel_requested, effective_state, liveness
from .paths import RunPaths
from .run_dir import UsageError, recorded_spec, run_paths
from .spec import JobSpec, SpecError, load_spec


@contextmanager
def _submission_lock(paths: RunPaths) -> Iterator[None]:
    descriptor = os.open(paths.submit_lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _refuse_different_spec(spec: JobSpec, source: Path, paths: RunPaths) -> bool:
    """True when ``paths`` already records this same spec; UsageError naming the fields when it records another."""
    try:
        recorded = recorded_spec(paths)
    except SpecError as error:
        raise UsageError(f"{paths.spec} (the spec recorded in the run directory) cannot be read: {error}") from None
    if recorded is None:
        return False
    differing = recorded.differences(spec)
    if differing:
        raise UsageError(
            f"{source}: run directory {paths.run_dir} holds a different job (fields that differ: "
            f"{', '.join(differing)}); submit the same spec to continue that run from `last`, or give this job "
            "another run_dir"
        )
    return True


def _close_lost_job(paths: RunPaths) -> run_state.RunState | None:
    """Record a job that is gone without an outcome as lost (submitter side, before a new submission).
    Refuses (StateError) while a SLURM job of a stopped run is still queued or alive."""
    state = run_state.load_state(paths)
    live = liveness(paths, state)
    if state is not None and state.executor == "slurm" and state.status in run_state.ENDED and live.alive:
        # A SIGTERM stop saves `last` and waits for SLURM to end the job, which may requeue it (preemption).
        reason = f" ({live.queue_reason})" if live.queue_reason else ""
        raise run_state.StateError(
            f"{paths.run_dir}: SLURM job {state.job_id} of this run is still {live.queue_state}{reason} (a stopped job "
            "waits for SLURM to end it, and a preempted one comes back by itself); wait until `elfes status` no "
            f"longer shows it in the queue, or `scancel {state.job_id}` first")
    if state is not None and state.status in run_state.ENDED and live.command:
        raise run_state.StateError(
            f"{paths.run_dir}: processes {list(live.command)} of this run's command are still running after its "
            f"attempt ended {state.status} (a wrapper's trainer, whose task is gone); a second trainer would write "
            f"the same run: `elfes cancel {paths.run_dir}` ends them, then submit or resume again")
    if effective_state(paths, state, live) is state:
        return state
    return run_state.update_state(
        paths, lambda s: run_state.mark_lost(s, cancelled=cancel_requested(paths, s)) if s is not None else s
    )


def _hand_over(spec: JobSpec, paths: RunPaths, executor: str, kind: str) -> run_state.RunState:
    """Record a submission of ``kind``, submit, record the job id (or the failure)."""
    run_state.update_state(paths, lambda s: run_state.record_submission(
        s, executor=executor, kind=kind, max_requeues=spec.requeue.max_requeues))
    try:
        job_id = executors.submit(spec, paths, executor)
    except (executors.SubmissionError, executors.ExecutorError) as error:
        message = str(error)
        run_state.update_state(paths, lambda s: run_state.mark_submission_failed(s, error=message))
        raise
    return run_state.update_state(paths, lambda s: run_state.mark_pending(s, job_id=job_id))


@dataclass(frozen=True)
class Submitted:
    run_dir: Path
    name: str
    executor: str
    job_id: str | None  # None for a dry run
    status: str | None
    continued: bool  # the run directory already held this spec: the job continues from `last`
    dry_run: str | None = None  # the sbatch script or local command of a dry run


def submit(spec_file: str | os.PathLike[str], *, executor: str = "auto", dry_run: bool = False) -> Submitted:
    """Validate ``spec_file``, create its run directory, record the spec and the submission, submit.

    ``dry_run``: return the sbatch script or local command instead, touching nothing.
    Submitting again to a run directory that holds a different spec is refused (UsageError naming the
    differing fields); the same spec continues the run from ``last``.
    """
    source = Path(spec_file)
    spec = load_spec(source)
    chosen = executors.choose_executor(executor)
    executors.check_executor(spec, chosen)
    paths = RunPaths(spec.run_dir)
    if dry_run:
        continued = paths.spec.is_file() and _refuse_different_spec(spec, source, paths)
        return Submitted(paths.run_dir, spec.name, chosen, None, None, continued,
                         executors.dry_run(spec, paths, chosen))
    if paths.run_dir.is_dir():
        _refuse_different_spec(spec, source, paths)  # before anything is written there
    try:
        paths.run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecError(f"{source}: run_dir = {str(spec.run_dir)!r}: cannot be created ({error.strerror or error}); "
                        "give a folder this user can create") from None
    with _submission_lock(paths):
        continued = _refuse_different_spec(spec, source, paths)
        if not continued:
            write_text_atomically(paths.spec, spec.to_yaml())
        _close_lost_job(paths)
        paths.cancel_marker.unlink(missing_ok=True)
        state = _hand_over(spec, paths, chosen, "submit")
    return Submitted(paths.run_dir, spec.name, chosen, state.job_id, state.status, continued)


def resume(run_dir: str | os.PathLike[str]) -> Submitted:
    """Submit a stopped, cancelled or failed run again, on its executor; it continues from ``last``."""
    paths = run_paths(run_dir)
    if not paths.spec.is_file():
        raise UsageError(f"{run_dir}: no recorded spec ({paths.spec.name}); submit the job with `elfes submit`")
    with _submission_lock(paths):
        state = _close_lost_job(paths)
        if state is None:
            raise UsageError(f"{run_dir}: no state.json (the job was never submitted); use `elfes submit`")
        if state.status not in run_state.RESUMABLE:
            hint = ("nothing is left to train; raise the budget in a new spec to train further"
                    if state.status == "finished" else "wait for it to stop, or `elfes cancel` it first")
            raise run_state.StateError(f"{run_dir}: the run is {state.status}; only a stopped, cancelled or failed "
                                       f"run can be resumed ({hint})")
        spec = load_spec(paths.spec)  # the entrypoint must still be there
        executors.check_executor(spec, state.executor)
        paths.cancel_marker.unlink(missing_ok=True)
        state = _hand_over(spec, paths, state.executor, "resume")
    return Submitted(paths.run_dir, spec.name, state.executor, state.job_id, state.status, True)


def resubmit_requeued(run_dir: str | os.PathLike[str]) -> str:
    """A local job's rank 0, past submitit's six starts: submit the requeued run again (a requeue).
    Returns the new job id."""
    paths = RunPaths(Path(run_dir))
    spec = load_spec(paths.spec, check_files=False)
    with _submission_lock(paths):
        state = _hand_over(spec, paths, "local", "requeue")
    return str(state.job_id)
