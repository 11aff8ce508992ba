"""The verbs that hand a run to an executor: ``elfes submit``, ``elfes resume``, and a local job's
requeue past submitit's start limit. Each records what it does in ``state.json`` (launcher/rundir/state.py)
under the run directory's submission lock, as one transaction (launcher/submit/transaction.py): the
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

from ..backends import Executor
from ..job.runtime import JobRuntime
from ..rundir import state as run_state
from ..rundir.code_record import load_code_record
from ..rundir.lookup import UsageError, run_paths
from ..rundir.paths import RunPaths
from ..rundir.state import Launch
from ..spec import JobSpec, read_spec_data, validate_spec_data
from ..spec.overrides import apply_overrides, describe_source, load_spec_with, parse_overrides
from ..submit import executors
from ..submit.code_plan import CodePlan, plan_resume, plan_submit
from ..submit.transaction import changes, hand_over_run, read_recorded_spec


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
    warnings: tuple[str, ...] = ()  # of the code: files left out as secrets, other code continuing the checkpoints


def _transaction(spec: JobSpec, paths: RunPaths, executor: Executor, kind: str, source: str, code: CodePlan,
                 include_nodes: bool = False) -> Submitted:
    """The hand-over (launcher/submit/transaction.py), its outcome as the verbs report it."""
    done = hand_over_run(spec, paths, executor, kind, source, code, JobRuntime(str(paths.run_dir)),
                         include_nodes=include_nodes)
    if done.adopted:
        return Submitted(paths.run_dir, spec.name, done.state.executor, done.state.job_id, done.state.status, True,
                         adopted=True)
    return Submitted(paths.run_dir, spec.name, done.state.executor, done.state.job_id, done.state.status,
                     done.changed is not None, changed=done.changed or (), code=done.code, warnings=code.warnings)


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
    # Before anything is written.
    changed = changes(spec, described, paths, read_recorded_spec(paths)) if paths.run_dir.is_dir() else None
    if code == "recorded" and load_code_record(paths) is not None:
        plan = CodePlan(keep=True)
    else:
        plan = plan_submit(spec, described, paths=paths)  # a snapshot over its size limit is refused here
    if dry_run:
        job = spec.model_copy(update={"workdir": plan.job_folder(paths, spec)})
        return Submitted(paths.run_dir, spec.name, chosen, None, None, changed is not None,
                         executors.dry_run(job, paths, chosen), changed=changed or (), warnings=plan.warnings)
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
    changes(spec, described, paths, read_recorded_spec(paths))  # refused fields: before anything is written
    return _transaction(spec, paths, chosen, Launch.RESUME, described, plan_resume(spec, paths, described, code),
                        include_nodes=include_nodes)
