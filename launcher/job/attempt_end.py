"""How a task leaves its attempt: :func:`finish_attempt` records an attempt's end (rank 0) and acts on it (every
rank alike), and :func:`exit_code` is the one place that says with which code a task leaves without returning.

The ways out of an attempt, every rank alike:

- finished, stopped or cancelled: the task returns a small dict (submitit writes it as the job's result);
  under SLURM a stopped task first waits until SLURM ends it, so that a preempted job is requeued by
  SLURM, while a cancelled attempt has rank 0 ``scancel`` the job, so that it never comes back;
- requeued (the requeue signal while requeues are left), or a failure that is retried: ``SystemExit`` with
  :func:`exit_code` (a rank that returned would write a success result for an attempt being relaunched);
- a hang that stands: ``os._exit`` with :func:`exit_code`, from the watchdog's thread (the main thread is stuck);
- a failure not retried: the error is re-raised, and submitit records it.

Torch-free.
"""

from __future__ import annotations

import logging
from typing import Any

from elfes.contract import TERMINATING_SIGNALS

from ..backends import Executor, backend_for
from ..rundir import state as run_state
from ..rundir.task_files import cancel_requested, remove_pid_file
from .attempt_context import AttemptContext
from .outcome import Decision
from .requeue import resubmit, wait_for_the_scheduler_to_end_the_job
from .tracker_publishing import publish_lifecycle

log = logging.getLogger(__name__)


def exit_code(executor: Executor, *, relaunched: bool) -> int:
    """The exit status of a task that leaves its attempt without returning. Relaunched (requeued, or a failure
    retried): the backend's ``relaunch_exit_code`` (locally 144, on which submitit's controller starts the job
    again; 0 under SLURM, where ``scontrol requeue`` already did: a nonzero exit would end the requeued job
    "failed"). Not relaunched (a hang that stands and is not retried): 1."""
    return backend_for(executor).relaunch_exit_code if relaunched else 1


def finish_attempt(context: AttemptContext, decision: Decision, *, step: int | None, task: Any) -> dict[str, Any]:
    """Record the outcome (rank 0) and act on it (every rank alike). ``task``: the job's ``JobRuntime``, which
    rank 0 resubmits where a local requeue is past submitit's start limit."""
    start = context.start
    backend = backend_for(start.executor)
    if decision.requeue and backend.requeues_from_inside and context.is_main:
        if cancel_requested(context.paths, context.state_at_start):
            # `elfes cancel` came while the job stopped for a requeue: the cancel wins (a requeued job
            # would come back, and scontrol requeue also requeues a job that scancel is ending).
            decision = Decision(run_state.Outcome.CANCELLED, signal=decision.signal)
        elif (refused := backend.requeue(start.job_id)) is not None:
            decision = Decision(run_state.Outcome.STOPPED, signal=decision.signal, error=refused)
    resubmits = decision.requeue and backend.resubmits(start.restart)
    if context.is_main:
        state = run_state.update_recorded_state(context.paths, lambda s: run_state.end_attempt(
            s, token=context.token, outcome=decision.outcome, signal=decision.signal, step=step,
            error=decision.error))
        # The trackers hear of an end that ends the run now (no mirror runs any more), before a scancel.
        publish_lifecycle(context.paths, context.spec, state, send=True)
        if resubmits:
            resubmit(context.paths, task, start.executor)
    log.info(f"elfes: attempt {context.attempt_number} ended {decision.outcome}"
             + (f" ({decision.signal})" if decision.signal else "") + (f" at step {step}" if step is not None else "")
             + (f": {decision.error}" if decision.error else ""))
    remove_pid_file(context.paths, start.rank)
    if decision.requeue:
        raise SystemExit(exit_code(start.executor, relaunched=True))
    if decision.outcome == run_state.Outcome.CANCELLED:
        # Cancelled for good: rank 0 ends the job (under SLURM it may have come back through a requeue that beat
        # the cancel) and every rank exits, which frees the allocation now; an exit is never requeued.
        if context.is_main:
            backend.end_cancelled(start.job_id)
    elif backend.outlives_its_end and decision.signal in TERMINATING_SIGNALS:
        # A job that exits during a preemption's grace time is not requeued; one that SLURM kills
        # is (PreemptMode=REQUEUE). So wait to be ended.
        wait_for_the_scheduler_to_end_the_job()
    return {"outcome": decision.outcome, "attempt": context.attempt_number, "step": step}
