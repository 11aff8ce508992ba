"""The verbs that hand a run to an executor: ``elfes submit``, ``elfes resume``, and a local job's
requeue past submitit's start limit. Each records what it does in ``state.json`` (launcher/rundir/state.py)
under the run directory's submission lock, as one transaction (launcher/submit/handover.py): the
submission is written ahead, a refused one leaves the run directory byte for byte as it was, Ctrl-C
waits for the hand-over to be recorded, and a hand-over a SIGKILL cut short is settled by the next.

A spec that differs from the recorded one continues the run only in the fields that may change
(launcher/submit/continuation.py); a finished run is resubmitted only with a raised budget.

Torch-free: ``submit`` and ``resume`` run on a login node.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from elfes.files import write_text_atomically

from ..job.runtime import JobRuntime
from ..rundir import state as run_state
from ..rundir.state import Launch, RunStatus
from ..rundir.liveness import cancel_requested, effective_state, liveness
from ..rundir.lookup import UsageError, recorded_spec, run_paths
from ..rundir.lost_cause import describe_lost
from ..rundir.paths import RunPaths
from ..spec import JobSpec, SpecError, read_spec_data, validate_spec_data
from ..spec.overrides import apply_overrides, describe_source, load_spec_with, parse_overrides
from ..rundir.code_record import job_spec, load_code_record
from ..submit import executors
from ..submit.code_plan import CodePlan, carry_out, plan_resume, plan_submit, prune_older
from ..submit.continuation import CHANGEABLE_FIELDS, budget_raised, extend_hint, refused_changes
from ..submit.handover import (
    Interrupted,
    RunDirUndo,
    interrupted_handover,
    record_ahead,
    record_job,
    reserve_room_for_record_job,
    signals_deferred,
    submission_lock,
)


@dataclass(frozen=True)
class Submitted:
    run_dir: Path
    name: str
    executor: str
    job_id: str | None  # None for a dry run
    status: str | None
    continued: bool  # the run directory already held this job: it continues from `last`
    dry_run: str | None = None  # the sbatch script or local command of a dry run
    changed: tuple[str, ...] = ()  # fields of the recorded spec this submission changed
    adopted: bool = False  # the job was started by an interrupted submission; none was started now
    code: str | None = None  # what the job runs: its code snapshot, kept or fresh, and the workdir's changes since


def _recorded(paths: RunPaths) -> JobSpec | None:
    try:
        return recorded_spec(paths)
    except SpecError as error:
        raise UsageError(f"{paths.spec} (the spec recorded in the run directory) cannot be read: {error}") from None


def _changes(spec: JobSpec, source: str, paths: RunPaths) -> tuple[str, ...] | None:
    """The fields in which ``spec`` changes the run recorded in ``paths`` (None: no run recorded yet);
    UsageError naming the fields that may not change in a run that has checkpoints."""
    recorded = _recorded(paths)
    if recorded is None:
        return None
    refused = refused_changes(recorded, spec, paths)
    if refused:
        raise UsageError(
            f"{source}: run directory {paths.run_dir} holds a different job (fields that may not change when a run "
            f"continues from its checkpoints: {', '.join(refused)}); they change what the run computes. Keep them "
            f"as recorded in {paths.spec} to continue that run (these may change: {', '.join(CHANGEABLE_FIELDS)}), "
            "or start a fresh run in another run_dir (e.g. --set run_dir=NEW_FOLDER)")
    return tuple(recorded.differences(spec))


def close_lost_job(paths: RunPaths) -> run_state.RunState | None:
    """Record a job that is gone without an outcome as lost (submitter side, before a new submission).
    Refuses (NotNow) while a SLURM job of a stopped run is still queued or alive."""
    state = run_state.load_state(paths)
    live = liveness(paths, state)
    if state is not None and state.executor == "slurm" and state.status in run_state.ENDED and live.alive:
        # A SIGTERM stop saves `last` and waits for SLURM to end the job, which may requeue it (preemption).
        reason = f" ({live.queue_reason})" if live.queue_reason else ""
        raise run_state.NotNow(
            f"{paths.run_dir}: SLURM job {state.job_id} of this run is still {live.queue_state}{reason} (a stopped job "
            "waits for SLURM to end it, and a preempted one comes back by itself); wait until `elfes status` no "
            f"longer shows it in the queue, or `scancel {state.job_id}` first")
    if state is not None and state.status in run_state.ENDED and live.command:
        raise run_state.NotNow(
            f"{paths.run_dir}: processes {list(live.command)} of this run's command are still running after its "
            f"attempt ended {state.status} (a wrapper's trainer, whose task is gone); a second trainer would write "
            f"the same run: `elfes cancel {paths.run_dir}` ends them, then submit or resume again")
    if effective_state(paths, state, live) is state:
        return state
    return run_state.update_state(
        paths, lambda s: run_state.mark_lost(s, cancelled=cancel_requested(paths, s), error=describe_lost(paths, s))
        if s is not None else s
    )


def settle_interrupted_handover(paths: RunPaths, changed: tuple[str, ...]) -> run_state.RunState | None:
    """A run left "submitted" by a submitter killed mid-hand-over: adopt the job it started (returned
    as a "pending" state), refuse while it may still be starting one, or record it abandoned (None)."""
    state = run_state.load_state(paths)
    if state is None or state.status != RunStatus.SUBMITTED:
        return None
    found = interrupted_handover(paths, state)
    earlier = state.submissions[-1] if state.submissions else None
    what = (f"an earlier submission ({earlier.kind} at {earlier.at}, pid {earlier.pid} on {earlier.host}) was "
            "interrupted before it recorded its job" if earlier else "an earlier submission was interrupted")
    if found.busy:
        raise run_state.NotNow(f"{paths.run_dir}: {what}, and {found.busy}; wait for it to finish, then try "
                                   f"again (`elfes status {paths.run_dir}` shows the run)")
    if found.job_id is not None:
        if changed:
            raise run_state.NotNow(
                f"{paths.run_dir}: {what}; its {state.executor} job {found.job_id} runs with the recorded spec, so "
                f"{', '.join(changed)} cannot change now; wait for it to end or `elfes cancel {paths.run_dir}`")
        return run_state.update_state(paths, lambda s: run_state.mark_pending(s, job_id=found.job_id))
    run_state.update_state(paths, lambda s: run_state.mark_submission_abandoned(
        s, error="interrupted before the executor took the job (the submitter was killed); no job of it was found"))
    return None


def _finished_refusal(paths: RunPaths, recorded: JobSpec | None, spec: JobSpec) -> str | None:
    """Why submitting ``spec`` is refused if the run is finished when the submission is recorded (its job
    may finish while this submitter decides); None when it raises the budget."""
    if recorded is None or budget_raised(recorded, spec):
        return None
    return (f"{paths.run_dir}: the run is finished; submitting it again would train nothing. To train further, "
            f"raise its budget: {extend_hint(paths, recorded)}")


def excluded_nodes(spec: JobSpec, paths: RunPaths, executor: str) -> tuple[str, ...]:
    """The nodes the run's next SLURM job leaves out (``--exclude``): those recorded after failures there, while
    ``requeue.exclude_failed_nodes`` is on."""
    if executor != "slurm" or not spec.requeue.exclude_failed_nodes:
        return ()
    state = run_state.load_state(paths)
    return state.excluded_hosts if state is not None else ()


def _transaction(spec: JobSpec, paths: RunPaths, executor: str, kind: str, source: str, code: CodePlan,
                 include_nodes: bool = False) -> Submitted:
    """Everything a submission writes, under the lock, with stop signals deferred; undone when refused.
    ``include_nodes``: the nodes the run excluded after failures are allowed again first."""
    with signals_deferred() as arrived:
        undo = RunDirUndo(paths)
        handed_over = False
        try:
            paths.run_dir.mkdir(parents=True, exist_ok=True)
            with submission_lock(paths):
                undo.take()
                changed = _changes(spec, source, paths)
                adopted = settle_interrupted_handover(paths, changed or ())
                if adopted is not None:
                    handed_over = True
                    return _finish(arrived, Submitted(paths.run_dir, spec.name, adopted.executor, adopted.job_id,
                                                      adopted.status, True, adopted=True))
                close_lost_job(paths)
                if include_nodes:
                    run_state.update_state(paths, lambda s: run_state.include_nodes(s) if s is not None else s)
                # Recorded before anything else is written: a refusal (a run that is, or just became, finished)
                # leaves the folder as it was, and from here on undo knows the run's files are this submission's.
                record_ahead(spec, paths, executor, kind, refuse_finished=_finished_refusal(paths, _recorded(paths), spec))
                if changed is None or changed:
                    write_text_atomically(paths.spec, spec.to_yaml())
                paths.cancel_marker.unlink(missing_ok=True)
                record = carry_out(code, paths, undo)
                reserved = reserve_room_for_record_job(paths)
                try:
                    job_id = executors.submit(job_spec(spec, paths), paths, executor, JobRuntime(str(paths.run_dir)),
                                              exclude=excluded_nodes(spec, paths, executor))
                except BaseException:
                    reserved.unlink(missing_ok=True)
                    raise
                handed_over = True
                state = record_job(paths, job_id)
                prune_older(paths, record)
        except OSError as error:
            if not handed_over:
                undo.restore()
            raise SpecError(f"{source}: run_dir = {str(paths.run_dir)!r}: cannot be written ({error.strerror or error}); "
                            "give a folder this user can write") from None
        except BaseException as error:
            if not handed_over:
                undo.restore()
                if arrived and isinstance(error, executors.SubmissionError):
                    raise Interrupted(arrived[0], f"the submission failed ({error}); the run directory is as it "
                                      "was") from None
            raise
    return _finish(arrived, Submitted(paths.run_dir, spec.name, executor, state.job_id, state.status,
                                      changed is not None, changed=changed or (),
                                      code=record.describe() if record is not None and code.note is None else code.note))


def _finish(arrived: list[int], result: Submitted) -> Submitted:
    if arrived:
        raise Interrupted(arrived[0], f"{result.name} was handed over first: {result.executor} job {result.job_id} "
                                      f"runs (elfes status {result.run_dir}; elfes cancel stops it)")
    return result


def submit(spec_file: str | os.PathLike[str], *, executor: str = "auto", dry_run: bool = False,
           sets: Sequence[str] = (), code: str = "current") -> Submitted:
    """Validate ``spec_file`` (with the ``--set`` texts ``sets`` applied), create its run directory,
    record the spec and the submission, submit.

    ``dry_run``: return the sbatch script or local command instead, touching nothing. Into a run
    directory that already holds a run, the spec continues it from ``last`` when it differs only in
    fields that may change (UsageError naming the others); a run without checkpoints takes any spec.
    A finished run is refused (NotNow) unless the spec raises its budget. ``code``: "current" takes a fresh
    code snapshot of the spec's workdir; "recorded" keeps the one the run directory's ``code.json`` names (a sweep
    member handed over by the sweep's scheduler runs the sweep's snapshot).
    """
    source = Path(spec_file)
    spec = load_spec_with(source, sets)
    described = describe_source(source, parse_overrides(sets))
    chosen = executors.choose_executor(executor)
    executors.check_executor(spec, chosen)
    paths = RunPaths(spec.run_dir)
    changed = _changes(spec, described, paths) if paths.run_dir.is_dir() else None  # before anything is written
    if code == "recorded" and load_code_record(paths) is not None:
        plan = CodePlan(keep=True)
    else:
        plan = plan_submit(spec, described)  # a snapshot over its size limit is refused here
    if dry_run:
        job = spec.model_copy(update={"workdir": plan.job_folder(paths, spec)})
        return Submitted(paths.run_dir, spec.name, chosen, None, None, changed is not None,
                         executors.dry_run(job, paths, chosen), changed=changed or ())
    return _transaction(spec, paths, chosen, Launch.SUBMIT, described, plan)


def resume(run_dir: str | os.PathLike[str], *, executor: str | None = None, sets: Sequence[str] = (),
           code: str = "snapshot", include_nodes: bool = False) -> Submitted:
    """Submit a stopped, cancelled or failed run again (on its executor, or on ``executor``); it continues
    from ``last``. ``sets`` change the recorded spec (the budget, resources, SLURM options, ...): a
    finished run continues when they raise its budget. ``code``: "snapshot" runs the code snapshot the run
    was submitted with (``Submitted.code`` names the workdir's files changed since), "current" takes a fresh
    one of the workdir as it is now (launcher/submit/code_plan.py). ``include_nodes``: the nodes the run
    excluded after failures there (``state.json``'s ``excluded_nodes``) may run it again; else a SLURM job
    leaves them out (``--exclude``)."""
    paths = run_paths(run_dir)
    if not paths.spec.is_file():
        raise UsageError(f"{run_dir}: no recorded spec ({paths.spec.name}); submit the job with `elfes submit`")
    overrides = parse_overrides(sets)
    if any(override.path == ("run_dir",) for override in overrides):
        raise UsageError(f"--set run_dir: `elfes resume` continues {paths.run_dir} itself; to start a fresh run "
                         "elsewhere, `elfes submit SPEC --set run_dir=NEW_FOLDER`")
    described = describe_source(paths.spec, overrides)
    # The entrypoint must still be there, unless the job runs a recorded snapshot of the code.
    keeps_snapshot = code == "snapshot" and load_code_record(paths) is not None
    spec = validate_spec_data(apply_overrides(read_spec_data(paths.spec), overrides), source=described,
                              base=paths.run_dir, check_files=not keeps_snapshot)
    state = run_state.load_state(paths)
    if state is None:
        raise UsageError(f"{run_dir}: no state.json (the job was never submitted); use `elfes submit`")
    chosen = executors.choose_executor(executor) if executor is not None else state.executor
    executors.check_executor(spec, chosen)
    _changes(spec, described, paths)  # refused fields: before anything is written
    return _transaction(spec, paths, chosen, Launch.RESUME, described, plan_resume(spec, paths, described, code),
                        include_nodes=include_nodes)
