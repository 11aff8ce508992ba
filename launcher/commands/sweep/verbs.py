"""The verbs of a sweep as a whole: ``elfes submit`` of a spec with a ``sweep`` (or ``--sweep``),
``elfes resume SWEEP_DIR`` (only the members that are not finished) and ``elfes cancel SWEEP_DIR``
(every live member). Torch-free.

Every member is validated before anything is created; then the sweep's one code snapshot is taken
(``SWEEP_DIR/code/1/``, which every member's ``code.json`` names), each member's run directory is created
with its own ``job.yaml`` (overrides applied, no ``sweep``), ``sweep.json`` is written, and the members
are handed over: on SLURM as chained job arrays, one per distinct set of sbatch options and at most
``MaxArraySize`` members each (launcher/commands/sweep/slurm.py), locally through the sweep's scheduler, at
most ``max_parallel`` at once (launcher/commands/sweep/local.py). A submission refused before any member
was handed over removes what it created; once an array is queued the sweep stays, and the members left
out are recorded for ``elfes resume SWEEP_DIR``. A local sweep whose members wait with no scheduler alive
is stalled: every verb says so, and ``elfes resume SWEEP_DIR`` starts one. A member is an ordinary run
directory: every verb that takes one works on it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from elfes.files import write_text_atomically

from ...backends import Executor, backend_for
from ...errors import NotNow
from ...rundir import state as run_state
from ...rundir.code_record import new_code_record, save_code_record
from ...rundir.lookup import UsageError, is_left_by_interrupted_creation
from ...rundir.paths import RunPaths, SweepPaths
from ...rundir.state import Launch, RunStatus
from ...rundir.sweep_record import (
    MemberRecord,
    SweepRecord,
    change_sweep,
    is_sweep_dir,
    load_sweep,
    save_sweep,
    stall,
    sweep_lock,
)
from ...rundir.sweep_status import NOT_STARTED, UNREADABLE, WAITING, sweep_status
from ...spec import SpecError
from ...spec.sweep import SweepPlan, plan_sweep
from ...submit import executors, scripts
from ...submit.code_plan import CodePlan, plan_submit
from ...submit.handover import Interrupted
from ...submit.snapshot import take
from ..signalling import Signalled, cancel
from .local import start_scheduler


@dataclass(frozen=True)
class SweepSubmitted:
    sweep_dir: Path
    name: str
    executor: str
    members: tuple[str, ...]  # the members handed over (or queued), in order
    skipped: dict[str, str]  # member -> why it was left alone (resume: finished, running)
    max_parallel: int
    job_ids: tuple[str, ...] = ()  # SLURM: the array job(s)
    dry_run: str | None = None
    scheduler_started: bool = False  # local: a scheduler was started (none was alive)
    refused: dict[str, str] = field(default_factory=dict)  # SLURM: members sbatch refused (or left after a refusal)
    error: str | None = None  # SLURM: sbatch's refusal of an array after others were queued
    notes: tuple[str, ...] = ()  # SLURM: e.g. an array that could not leave its members' excluded nodes out
    warnings: tuple[str, ...] = ()  # of the sweep's code snapshot: the files it left out as secrets


def _check_folder(plan: SweepPlan) -> None:
    sweep_dir = plan.sweep_dir
    if is_sweep_dir(sweep_dir):
        raise UsageError(f"{plan.source}: run_dir {sweep_dir} already holds a sweep; `elfes status {sweep_dir}` "
                         f"shows it and `elfes resume {sweep_dir}` continues it; to start another sweep, give another "
                         "run_dir (--set run_dir=NEW_FOLDER)")
    if RunPaths(sweep_dir).spec.exists() or RunPaths(sweep_dir).state.exists():
        raise UsageError(f"{plan.source}: run_dir {sweep_dir} is the run directory of a single run; a sweep needs a "
                         "folder of its own: give another run_dir (--set run_dir=NEW_FOLDER)")
    for member in plan.members:
        folder = member.spec.run_dir
        # A folder holding only the job.yaml that an `elfes submit` killed before it wrote sweep.json left: reused.
        if folder.exists() and any(folder.iterdir()) and not is_left_by_interrupted_creation(folder):
            raise UsageError(f"{plan.source}: sweep member {member.index} ({member.name}): {folder} exists and is "
                             "not empty; remove it or give the sweep another run_dir")


def _dry_run(plan: SweepPlan, executor: str) -> str:
    if backend_for(executor).sweeps_as_arrays:
        from ...submit.cluster_checks import max_array_size
        from .slurm import array_scripts

        return array_scripts(plan, max_array_size())
    lines = [f"# local sweep {plan.base.name}: {len(plan.members)} member(s), at most {plan.max_parallel} at once, "
             "started in this order by a detached scheduler as slots free:"]
    lines += [f"#   {member.index}: {member.spec.run_dir}" for member in plan.members]
    lines.append(f"# each member is a local job; member 0 ({plan.members[0].name}):")
    return "\n".join(lines) + "\n" + scripts.local_plan(plan.members[0].spec, RunPaths(plan.members[0].spec.run_dir))


def _code_plan(plan: SweepPlan) -> CodePlan:
    """One code snapshot for the whole sweep (refused here when too large): its members may not differ in
    ``workdir`` or ``snapshot``."""
    first = plan.members[0].spec
    for member in plan.members[1:]:
        for name in ("workdir", "snapshot"):
            if getattr(member.spec, name) != getattr(first, name):
                raise SpecError(f"{plan.source}: sweep member {member.index} ({member.name}) has another {name} than "
                                f"member 0; the members of a sweep run one code snapshot: do not sweep {name}")
    return plan_submit(first, plan.source, leave_out=(plan.sweep_dir,))


def _create(plan: SweepPlan, executor: Executor, code: CodePlan) -> SweepRecord:
    """The sweep folder, its one code snapshot, each member's run directory with its recorded spec and its
    ``code.json`` naming that snapshot, and ``sweep.json``."""
    members = tuple(MemberRecord(member.index, member.name, str(member.spec.run_dir), member.overrides)
                    for member in plan.members)
    snapshot = None
    if code.selection is not None:
        snapshot = new_code_record(*take(code.selection, SweepPaths(plan.sweep_dir).code), "submit")
    for member in plan.members:
        member.spec.run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomically(RunPaths(member.spec.run_dir).spec, member.spec.to_yaml())
        save_code_record(RunPaths(member.spec.run_dir), snapshot)
    at = run_state.now()
    queue = () if backend_for(executor).sweeps_as_arrays else tuple(
        {"name": member.name, "at": at} for member in members)
    record = SweepRecord(name=plan.base.name, executor=executor, max_parallel=plan.max_parallel, members=members,
                         queue=queue)
    save_sweep(SweepPaths(plan.sweep_dir), record)
    return record


def _remove_created(plan: SweepPlan, existed: bool) -> None:
    if not existed:
        shutil.rmtree(plan.sweep_dir, ignore_errors=True)
        return
    for member in plan.members:
        shutil.rmtree(member.spec.run_dir, ignore_errors=True)
    shutil.rmtree(SweepPaths(plan.sweep_dir).code, ignore_errors=True)  # a sweep folder holds one sweep
    for file in (SweepPaths(plan.sweep_dir).record, SweepPaths(plan.sweep_dir).lock):
        file.unlink(missing_ok=True)


def submit(spec_file: str | os.PathLike[str], *, executor: str = "auto", dry_run: bool = False,
           sets: Sequence[str] = (), sweeps: Sequence[str] = (), max_parallel: int | None = None) -> SweepSubmitted:
    """Validate every member of the sweep, create the sweep folder and its members, hand them over."""
    plan = plan_sweep(spec_file, sets=sets, sweeps=sweeps, max_parallel=max_parallel)
    chosen = executors.choose_executor(executor)
    for member in plan.members:
        try:
            executors.check_executor(member.spec, chosen)
        except executors.ExecutorError as error:
            raise executors.ExecutorError(f"sweep member {member.index} ({member.name}): {error}") from None
    names = tuple(member.name for member in plan.members)
    code = _code_plan(plan)  # before anything is created
    if dry_run:
        return SweepSubmitted(plan.sweep_dir, plan.base.name, chosen, names, {}, plan.max_parallel,
                              dry_run=_dry_run(plan, chosen))
    _check_folder(plan)
    limit = None
    if backend_for(chosen).sweeps_as_arrays:
        from ...submit.cluster_checks import max_array_size

        limit = max_array_size()  # before anything is created: the arrays are cut to it
    existed = plan.sweep_dir.exists()
    submitted = None
    try:
        plan.sweep_dir.mkdir(parents=True, exist_ok=True)
        record = _create(plan, chosen, code)
        if backend_for(chosen).sweeps_as_arrays:
            from .slurm import submit_array

            with sweep_lock(SweepPaths(plan.sweep_dir)):
                submitted = submit_array(SweepPaths(plan.sweep_dir), record, list(record.members), kind=Launch.SUBMIT,
                                         limit=limit)
            job_ids = tuple(submitted.array_ids)
        else:
            start_scheduler(SweepPaths(plan.sweep_dir))
            job_ids = ()
    except OSError as error:
        _remove_created(plan, existed)
        raise SpecError(f"{plan.source}: run_dir = {str(plan.sweep_dir)!r}: cannot be written "
                        f"({error.strerror or error}); give a folder this user can write") from None
    except BaseException:
        _remove_created(plan, existed)  # nothing was handed over: sbatch refused the first array, or a kill
        raise
    result = SweepSubmitted(plan.sweep_dir, plan.base.name, chosen, names, {}, plan.max_parallel, tuple(job_ids),
                            warnings=code.warnings)
    return _after_arrays(result, submitted)


def _after_arrays(result: SweepSubmitted, submitted: Any) -> SweepSubmitted:
    """A SLURM hand-over's end: the members sbatch refused (the arrays queued before stay: the sweep is kept),
    and a Ctrl-C held until every array was recorded, raised now as :class:`Interrupted` (exit 130)."""
    if submitted is None:
        return result
    refused = dict(submitted.refused)
    result = replace(result, members=tuple(name for name in result.members if name not in refused), refused=refused,
                     error=submitted.error, notes=submitted.notes)
    if submitted.interrupted is not None:
        raise Interrupted(submitted.interrupted, f"the sweep was handed over first: SLURM job array(s) "
                          f"{', '.join(result.job_ids) or 'none'} queued (elfes status {result.sweep_dir}; "
                          f"elfes cancel {result.sweep_dir} stops them)")
    return result


def sweep_paths(sweep_dir: str | os.PathLike[str]) -> SweepPaths:
    paths = SweepPaths(Path(os.path.abspath(sweep_dir)))
    if not paths.record.is_file():
        raise UsageError(f"{sweep_dir}: not a sweep folder (no {paths.record.name})")
    return paths


def resume(sweep_dir: str | os.PathLike[str], *, executor: str | None = None,
           sets: Sequence[str] = (), include_nodes: bool = False) -> SweepSubmitted:
    """Hand over again only the members that are not finished and not live (stopped, cancelled, failed,
    never started); finished and running members are left alone. On SLURM each array leaves out the nodes its
    members excluded after failures; ``include_nodes`` allows them again first."""
    paths = sweep_paths(sweep_dir)
    if sets:
        raise UsageError(f"{sweep_dir}: `elfes resume SWEEP_DIR` takes no --set; resume a member with its own "
                         "changes: elfes resume SWEEP_DIR/MEMBER --set KEY=VALUE")
    with sweep_lock(paths):
        record = load_sweep(paths)
        chosen = executors.choose_executor(executor) if executor is not None else record.executor
        status = {member.name: member for member in sweep_status(paths.sweep_dir, record).members}
        due: list[MemberRecord] = []
        skipped: dict[str, str] = {}
        for member in record.members:
            now_status = status[member.name].status
            if now_status == RunStatus.FINISHED:
                skipped[member.name] = RunStatus.FINISHED
            elif now_status == UNREADABLE:
                skipped[member.name] = f"{UNREADABLE}: {status[member.name].error}"
            elif now_status in run_state.ENDED or now_status in (NOT_STARTED, RunStatus.SUBMITTED):
                due.append(member)  # "submitted": a hand-over cut short; settled (its job adopted) under the lock
            else:
                skipped[member.name] = now_status  # live, or already waiting for a slot
        if not due and backend_for(record.executor).sweeps_as_arrays:
            from .slurm import record_adopted_arrays

            record_adopted_arrays(paths, record)
        if not due:
            # Members waiting for a slot with no scheduler alive (it was killed, or never started): start one.
            healed = (not backend_for(chosen).sweeps_as_arrays and chosen == record.executor
                      and stall(paths, record) is not None
                      and start_scheduler(paths) != 0)
            return SweepSubmitted(paths.sweep_dir, record.name, chosen, (), skipped, record.max_parallel,
                                  scheduler_started=healed)
        submitted = None
        if backend_for(chosen).sweeps_as_arrays:
            from ...submit.cluster_checks import max_array_size
            from .slurm import record_adopted_arrays, submit_array

            try:
                submitted = submit_array(paths, record, due, kind=Launch.RESUME, limit=max_array_size(),
                                         include_nodes=include_nodes)
            except OSError as error:  # a full disk: refused before sbatch was asked, every member as it was
                raise NotNow(f"{paths.sweep_dir}: its members cannot be written ({error.strerror or error}); nothing "
                             f"was handed over. Free some room, then `elfes resume {paths.sweep_dir}` again") from None
            change_sweep(paths, lambda r: replace(r, executor=chosen))
            record_adopted_arrays(paths, load_sweep(paths))
            skipped |= submitted.left
            due = [member for member in due if member.name not in submitted.left]
            job_ids = tuple(submitted.array_ids)
            started = False
        else:
            at = run_state.now()
            change_sweep(paths, lambda r: replace(
                r, executor=chosen, queue=(*r.queue, *({"name": m.name, "at": at} for m in due)),
                problems={name: text for name, text in r.problems.items() if name not in {m.name for m in due}}))
            started = start_scheduler(paths) != 0  # 0: a scheduler is alive and takes the new entries
            job_ids = ()
    result = SweepSubmitted(paths.sweep_dir, record.name, chosen, tuple(member.name for member in due), skipped,
                            record.max_parallel, tuple(job_ids), scheduler_started=started)
    return _after_arrays(result, submitted)


@dataclass(frozen=True)
class SweepCancelled:
    sweep_dir: Path
    signalled: list[Signalled]  # one per live member
    unqueued: tuple[str, ...]  # members that were waiting for a slot and now will not start


def cancel_order(members: Sequence[Any], jobs: Sequence[Any]) -> list[Any]:
    """``members`` (each with a ``job_id``) in the order a sweep's cancel reaches them: the chained arrays' from
    the last array (``jobs``, sweep.json's, in hand-over order) to the first, and within an array from the last
    task to the first. Each array waits for the one before (``afterany``) and a throttled task for a running
    one: cancelled first, no dependent can start while the one it waits for is being cancelled. Members
    whose job is no array of the sweep's (resumed alone) come first; their order does not matter."""
    position = {job.job_id: number for number, job in enumerate(jobs)}

    def key(member: Any) -> tuple[int, int]:
        array, _, task = (member.job_id or "").partition("_")
        return (-position.get(array, len(position)), -int(task) if task.isdigit() else 0)

    return sorted(members, key=key)


def cancel_sweep(sweep_dir: str | os.PathLike[str]) -> SweepCancelled:
    """Empty the local queue (waiting members do not start), then cancel every live member (each saves
    ``last`` and ends cancelled; `elfes resume SWEEP_DIR` continues the unfinished ones), later arrays first
    (:func:`cancel_order`)."""
    paths = sweep_paths(sweep_dir)
    with sweep_lock(paths):
        record = load_sweep(paths)
        change_sweep(paths, lambda r: replace(r, queue=()))
        signalled = []
        for member in cancel_order(sweep_status(paths.sweep_dir, record).members, record.jobs):
            # A SLURM member that stopped on SIGTERM waits for SLURM to end it (and may come back): cancel it too.
            waits = (member.executor is not None and backend_for(member.executor).outlives_its_end
                     and member.status == RunStatus.STOPPED)
            if member.status not in (*run_state.ENDED, WAITING, NOT_STARTED) or waits:
                signalled.append(cancel(member.run_dir))
    return SweepCancelled(paths.sweep_dir, signalled, tuple(entry["name"] for entry in record.queue))
