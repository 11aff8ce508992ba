"""One hand-over of a run to an executor, for every caller: ``elfes submit`` and ``elfes resume`` of a run, a
sweep's members (one at a time by the local scheduler, many in one SLURM job array) and a local job's
resubmission past submitit's start limit.

A hand-over holds the run directory's submission lock and its state lock to the end (nothing else writes
``state.json`` meanwhile: a job of the run records its attempt once the hand-over is recorded), reads
``state.json`` and the recorded ``job.yaml`` once (:class:`HandOver`), decides with functions of what it
read, then takes the steps of :func:`hand_over`, the same for one run and for the members of a SLURM job array
(launcher/commands/sweep/slurm.py): each submission written ahead, the room to record each job reserved, the
executor asked once, each job recorded; or every change undone (launcher/submit/handover.py's
:class:`RunDirUndo`). The order: :meth:`HandOver.settle`, :func:`hand_over`, or :meth:`HandOver.restore` of
what the executor did not take. :func:`hand_over_run` is all of it for one run. Torch-free.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elfes.files import exclusive_lock, write_text_atomically

from ..backends import Executor, backend_for
from ..rundir import state as run_state
from ..rundir.code_record import CodeRecord, job_spec
from ..rundir.liveness import effective_state, liveness
from ..rundir.lookup import UsageError, recorded_spec
from ..rundir.lost_cause import describe_lost
from ..rundir.paths import RunPaths
from ..rundir.task_files import cancel_requested
from ..spec import JobSpec, SpecError
from . import executors
from .code_plan import CodePlan, carry_out, prune_older
from .continuation import CHANGEABLE_FIELDS, budget_raised, extend_hint, refused_changes, world_size_refusal
from .handover import (
    Interrupted,
    RunDirUndo,
    interrupted_handover,
    reserve_room_for_record_job,
    signals_deferred,
    submission_lock,
)


def read_recorded_spec(paths: RunPaths) -> JobSpec | None:
    """The spec recorded in the run directory (None before the first submission); UsageError when it cannot be read."""
    try:
        return recorded_spec(paths)
    except SpecError as error:
        raise UsageError(f"{paths.spec} (the spec recorded in the run directory) cannot be read: {error}") from None


def changes(spec: JobSpec, source: str, paths: RunPaths, recorded: JobSpec | None) -> tuple[str, ...] | None:
    """The fields in which ``spec`` changes the ``recorded`` run (None: no run recorded yet); UsageError naming
    the fields that may not change in a run that has checkpoints."""
    if recorded is None:
        return None
    refused = refused_changes(recorded, spec, paths)
    if refused:
        raise UsageError(
            f"{source}: run directory {paths.run_dir} holds a different job (fields that may not change when a run "
            f"continues from its checkpoints: {', '.join(refused)}); they change what the run computes. Keep them "
            f"as recorded in {paths.spec} to continue that run (these may change: {', '.join(CHANGEABLE_FIELDS)}), "
            "or start a fresh run in another run_dir (e.g. --set run_dir=NEW_FOLDER)")
    resized = world_size_refusal(recorded, spec, paths)
    if resized is not None:
        raise UsageError(f"{source}: {resized}")
    return tuple(recorded.differences(spec))


def finished_refusal(paths: RunPaths, recorded: JobSpec | None, spec: JobSpec) -> str | None:
    """Why submitting ``spec`` is refused if the run is finished when the submission is recorded; None when it
    raises the budget."""
    if recorded is None or budget_raised(recorded, spec):
        return None
    return (f"{paths.run_dir}: the run is finished; submitting it again would train nothing. To train further, "
            f"raise its budget: {extend_hint(paths, recorded)}")


def excluded_nodes(spec: JobSpec, state: run_state.RunState | None, executor: Executor) -> tuple[str, ...]:
    """The nodes the run's next job leaves out (``--exclude``): those recorded after failures there, where its
    backend leaves nodes out and ``requeue.exclude_failed_nodes`` is on."""
    if state is None or not backend_for(executor).excludes_failed_nodes(spec):
        return ()
    return state.excluded_hosts


def lost_job_closed(paths: RunPaths, state: run_state.RunState | None) -> run_state.RunState | None:
    """``state`` with a job that is gone without an outcome recorded as lost. Refuses (NotNow) while a SLURM
    job of a stopped run is still queued or alive, or a command's processes outlive its attempt."""
    live = liveness(paths, state)
    lingers = state is not None and backend_for(state.executor).outlives_its_end and state.status in run_state.ENDED
    if state is not None and lingers and live.alive:
        # A SIGTERM stop saves `last` and waits for SLURM to end the job, which may requeue it (preemption).
        reason = f" ({live.queue_reason})" if live.queue_reason else ""
        raise run_state.NotNow(
            f"{paths.run_dir}: {backend_for(state.executor).job_name(state.job_id)} of this run is still "
            f"{live.queue_state}{reason} (a stopped job "
            "waits for SLURM to end it, and a preempted one comes back by itself); wait until `elfes status` no "
            f"longer shows it in the queue, or `scancel {state.job_id}` first")
    if state is not None and state.status in run_state.ENDED and live.command:
        raise run_state.NotNow(
            f"{paths.run_dir}: processes {list(live.command)} of this run's command are still running after its "
            f"attempt ended {state.status} (a wrapper's trainer, whose task is gone); a second trainer would write "
            f"the same run: `elfes cancel {paths.run_dir}` ends them, then submit or resume again")
    if state is None or effective_state(paths, state, live) is state:
        return state
    return run_state.mark_lost(state, cancelled=cancel_requested(paths, state), error=describe_lost(paths, state))


def interrupted_handover_settled(paths: RunPaths, state: run_state.RunState | None,
                                 changed: tuple[str, ...]) -> tuple[run_state.RunState | None, bool]:
    """For a run left "submitted" by a submitter killed mid-hand-over: the state with the job it started adopted
    ("pending", True), or recorded abandoned (False); refused (NotNow) while it may still be starting one.
    Any other state is returned as it is."""
    if state is None or state.status != run_state.RunStatus.SUBMITTED:
        return state, False
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
        return run_state.mark_pending(state, job_id=found.job_id), True
    abandoned = run_state.mark_submission_abandoned(
        state, error="interrupted before the executor took the job (the submitter was killed); no job of it was found")
    return abandoned, False


State = run_state.RunState | None


def _recorded_ahead(state: run_state.RunState | None, paths: RunPaths) -> run_state.RunState:
    """The state this hand-over recorded ahead (RunDamaged, naming the file, if it vanished since)."""
    if state is None:
        raise run_state.RunDamaged(f"{paths.state} vanished during the hand-over; `elfes status {paths.run_dir}` "
                                   "shows what is left, then submit again")
    return state


class HandOver:
    """One run's hand-over, open under its submission lock and state lock (:func:`held`): ``state`` and
    ``recorded`` are what the run directory holds, read once and kept as this hand-over writes. ``undo``:
    what restores the run directory when the executor refuses (None: a local resubmission, whose refusal is
    recorded instead)."""

    def __init__(self, paths: RunPaths, undo: RunDirUndo | None) -> None:
        self.paths = paths
        self.undo = undo
        self._state: run_state.RunState | None = None
        self._state_read = False
        self._recorded: JobSpec | None = None
        self._recorded_read = False
        self.taken = False  # the executor took this run's job (:func:`hand_over`): nothing of it may be undone now

    @property
    def state(self) -> run_state.RunState | None:
        """The run's state: ``state.json`` as read once (at first use), then as this hand-over wrote it."""
        if not self._state_read:
            self._state, self._state_read = run_state.load_state(self.paths), True
        return self._state

    @property
    def recorded(self) -> JobSpec | None:
        """The spec recorded in the run directory when the hand-over began (``job.yaml``, read at first use)."""
        if not self._recorded_read:
            self._recorded, self._recorded_read = read_recorded_spec(self.paths), True
        return self._recorded

    def write(self, change: Callable[[State], State]) -> State:
        """Apply the transition ``change`` to the state and publish it (nothing is written when it is unchanged)."""
        before = self.state
        after = change(before)
        if after is not before and after is not None:
            run_state.save_state(self.paths, after)
        self._state = after
        return after

    def settle(self, changed: tuple[str, ...]) -> bool:
        """Settle what earlier hand-overs left: True when a job an interrupted one started is adopted (the run
        is handed over already); else a job gone without an outcome is recorded lost."""
        settled, adopted = interrupted_handover_settled(self.paths, self.state, changed)
        self.write(lambda state: settled)
        if adopted:
            return True
        closed = lost_job_closed(self.paths, self.state)
        self.write(lambda state: closed)
        return False

    def include_nodes(self) -> None:
        """``--include-nodes``: the nodes the run excluded after failures may run it again."""
        self.write(lambda s: run_state.include_nodes(s) if s is not None else s)

    def record_ahead(self, spec: JobSpec, executor: Executor, kind: str, *, submitit_folder: Path | None = None,
                     array_task: int | None = None, refuse_finished: str | None = None) -> None:
        """Record a submission of ``kind`` before the executor is asked, naming this submitter (and, for a sweep
        member, the sweep's submitit folder and the member's task in the array)."""
        self.write(lambda s: run_state.record_submission(
            s, executor=executor, kind=kind, max_requeues=spec.requeue.max_requeues,
            host=socket.gethostname(), pid=os.getpid(),
            submitit_folder=str(submitit_folder) if submitit_folder is not None else None, array_task=array_task,
            refuse_finished=refuse_finished, run_dir=str(self.paths.run_dir)))

    def record_job(self, job_id: str) -> run_state.RunState:
        """The executor took the latest submission as ``job_id``."""
        state = self.write(lambda s: run_state.mark_pending(_recorded_ahead(s, self.paths), job_id=job_id))
        assert state is not None  # recorded ahead
        return state

    def restore(self) -> None:
        """The executor refused: the run directory as it was before this hand-over (its undo)."""
        assert self.undo is not None
        self.undo.restore()

    def record_refusal(self, error: str) -> None:
        """The executor refused a submission that has no undo (a local resubmission): the run is failed."""
        self.write(lambda s: run_state.mark_submission_failed(_recorded_ahead(s, self.paths), error=error))


@contextmanager
def held(paths: RunPaths, undo: RunDirUndo | None = None, *, undoable: bool = True) -> Iterator[HandOver]:
    """The run directory under its submission lock and state lock, read once. ``undo``: taken before the run
    directory was created; else taken here under both locks (``undoable``: False for none)."""
    with submission_lock(paths), exclusive_lock(paths.state_lock):
        if undo is not None:
            undo.take()  # another submission, or the run's job, may have written while this one waited
        elif undoable:
            undo = RunDirUndo(paths)  # its snapshot, taken under both locks
        yield HandOver(paths, undo)


@dataclass(frozen=True)
class Ahead:
    """What one run's submission records before the executor is asked (:meth:`HandOver.record_ahead`): for a
    sweep member, the sweep's submitit folder and its task in the array too."""

    spec: JobSpec
    executor: Executor
    kind: str
    submitit_folder: Path | None = None
    array_task: int | None = None
    refuse_finished: str | None = None
    clear_cancel: bool = True  # False for a resubmission from inside the job: a cancel meanwhile still holds


def hand_over(runs: Sequence[tuple[HandOver, Ahead]], ask: Callable[[], Sequence[str]], *,
              prepare: Callable[[HandOver], None] | None = None) -> list[run_state.RunState]:
    """The steps of every hand-over once its runs are held and settled, in this order, for one run and for the
    members of a job array alike: each run's submission recorded ahead (before anything else is written, so that
    a refusal leaves the folder as it was and undo knows the run's files are this submission's), its cancel
    marker removed, ``prepare`` (a single run's spec and code); then the room each run needs to record its job
    reserved (a full disk refuses here, while everything can still be undone); then the executor asked once
    (``ask``: one job id per run, in order); then each run's job recorded. When anything before the executor's
    answer raises, the reserved room is freed and the error raised: the caller restores the runs
    (:meth:`HandOver.restore`), whose ``taken`` is still False."""
    for run, ahead in runs:
        run.record_ahead(ahead.spec, ahead.executor, ahead.kind, submitit_folder=ahead.submitit_folder,
                         array_task=ahead.array_task, refuse_finished=ahead.refuse_finished)
        if ahead.clear_cancel:
            run.paths.cancel_marker.unlink(missing_ok=True)
        if prepare is not None:
            prepare(run)
    with ExitStack() as rooms:
        for run, _ in runs:
            rooms.enter_context(room_to_record_job(run.paths))
        job_ids = ask()
    for run, _ in runs:
        run.taken = True
    return [run.record_job(job_id) for (run, _), job_id in zip(runs, job_ids, strict=True)]


@contextmanager
def room_to_record_job(paths: RunPaths) -> Iterator[None]:
    """The room recording the job needs, taken for the block (launcher/submit/handover.py's
    :func:`reserve_room_for_record_job`): freed when the block raises, else reused by the write of ``state.json``."""
    reserved = reserve_room_for_record_job(paths)
    try:
        yield
    except BaseException:
        reserved.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class HandedOver:
    """What :func:`hand_over_run` did: the run's state after it, and what it changed of the recorded spec."""

    state: run_state.RunState
    changed: tuple[str, ...] | None  # None: no run was recorded yet
    adopted: bool = False  # a job an interrupted hand-over started was adopted; none was started now
    code: str | None = None  # the code the job runs (CodeRecord.describe()), when a record was carried out


def hand_over_run(spec: JobSpec, paths: RunPaths, executor: Executor, kind: str, source: str, code: CodePlan, task: Any,
                  *, include_nodes: bool = False) -> HandedOver:
    """Hand one run over (``kind``: "submit" or "resume"), under the lock, with stop signals deferred, through
    :func:`hand_over`; every change undone when refused. ``task``: the job's callable. ``include_nodes``: the nodes
    the run excluded after failures are allowed again first. A stop signal that arrived meanwhile raises
    :class:`Interrupted` once the hand-over is recorded, saying what was handed over."""
    with signals_deferred() as arrived:
        undo = RunDirUndo(paths)
        handed_over = False
        record: CodeRecord | None = None
        try:
            paths.run_dir.mkdir(parents=True, exist_ok=True)
            with held(paths, undo) as run:
                changed = changes(spec, source, paths, run.recorded)
                if run.settle(changed or ()):
                    handed_over = True
                    assert run.state is not None
                    result = HandedOver(run.state, changed, adopted=True)
                    return _finish(arrived, result, spec, paths)
                if include_nodes:
                    run.include_nodes()

                def prepare(_: HandOver) -> None:
                    nonlocal record
                    if changed is None or changed:
                        write_text_atomically(paths.spec, spec.to_yaml())
                    record = carry_out(code, paths, undo)

                def ask() -> list[str]:
                    return [executors.submit(job_spec(spec, paths), paths, executor, task,
                                             exclude=excluded_nodes(spec, run.state, executor))]

                ahead = Ahead(spec, executor, kind, refuse_finished=finished_refusal(paths, run.recorded, spec))
                try:
                    [state] = hand_over([(run, ahead)], ask, prepare=prepare)
                finally:
                    handed_over = run.taken
                prune_older(paths, record)
        except OSError as error:
            if not handed_over:
                undo.restore()
            raise SpecError(f"{source}: run_dir = {str(paths.run_dir)!r}: cannot be written "
                            f"({error.strerror or error}); give a folder this user can write") from None
        except BaseException as error:
            if not handed_over:
                undo.restore()
                if arrived and isinstance(error, executors.SubmissionError):
                    raise Interrupted(arrived[0], f"the submission failed ({error}); the run directory is as it "
                                      "was") from None
            raise
    described = record.describe() if record is not None and code.note is None else code.note
    return _finish(arrived, HandedOver(state, changed, code=described), spec, paths)


def _finish(arrived: list[int], result: HandedOver, spec: JobSpec, paths: RunPaths) -> HandedOver:
    if arrived:
        raise Interrupted(arrived[0], f"{spec.name} was handed over first: {result.state.executor} job "
                                      f"{result.state.job_id} runs (elfes status {paths.run_dir}; elfes cancel stops it)")
    return result


def resubmit_run(paths: RunPaths, task: Any, executor: Executor) -> str:
    """Past its controller's start limit (``Backend.resubmits``), hand the run over again as a "requeue"
    submission on ``executor`` through :func:`hand_over` (rank 0 of the job, after recording "requeued"); returns
    the new job id. A refusal is recorded (the run is failed) and raised; nothing is undone."""
    from ..spec import load_spec_with

    spec = load_spec_with(paths.spec, check_files=False)
    with held(paths, undoable=False) as run:
        ahead = Ahead(spec, executor, run_state.Launch.REQUEUE, clear_cancel=False)
        try:
            [state] = hand_over([(run, ahead)], lambda: [executors.submit(job_spec(spec, paths), paths, executor,
                                                                          task)])  # the run's code snapshot
        except (executors.SubmissionError, executors.ExecutorError) as error:
            run.record_refusal(str(error))
            raise
    assert state.job_id is not None  # just recorded
    return state.job_id
