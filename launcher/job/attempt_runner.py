"""One task's part of one attempt, top to bottom: :class:`AttemptRunner`.

It begins the attempt (the task's streams on the attempt's logs, rank 0's record in ``state.json``, the pid
file), prepares the process (the spec's ``env``, the code snapshot as the working folder, the torch
distributed environment), runs the entrypoint or the command, and hands the end to
launcher/job/attempt_end.py, or a failure to launcher/job/failed_attempt.py. Torch-free at import time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from elfes.records.tracking import GROUP_VARIABLE, TRACKING_VARIABLE

from ..backends import backend_for
from ..rundir import state as run_state
from ..rundir.code_record import load_code_record
from ..rundir.provenance import changes_at, place_changes_at
from ..rundir.task_files import cancel_requested, redirect_standard_streams, remove_pid_file, write_pid_file
from ..spec import JobSpec
from .attempt_context import AttemptContext
from .attempt_end import exit_code, finish_attempt
from .command import run_command
from .distributed_env import export_distributed_environment, reserve_rendezvous_port
from .entrypoint import Job, load_entrypoint, release_process_group
from .failed_attempt import FailurePath
from .failures import FailureReport
from .outcome import Decision, decide
from .provenance import collect, rank_place
from .resume_point import resume_point
from .signals import SignalFlags
from .tracker_publishing import publish_lifecycle, tracker_group
from .watchdog import HangWatchdog, end_stuck_peers

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunEnd:
    """How the entrypoint or the command ended: the stop reason every rank agreed on, the step, and a command
    job's note on how its stop ended (launcher/job/command.py)."""

    stop_reason: str | None
    step: int | None
    note: str | None = None


class AttemptRunner:
    """Runs one task's part of one attempt. ``task`` is the job's ``JobRuntime`` (what a local retry or requeue
    past submitit's start limit resubmits)."""

    def __init__(self, context: AttemptContext, flags: SignalFlags, *, task: Any) -> None:
        self.context = context
        self.flags = flags
        self.task = task
        self.failures = FailurePath(context, task=task)
        paths, start = context.paths, context.start
        redirect_standard_streams(paths, attempt=context.attempt_number, rank=start.rank)
        if context.is_main:
            run_state.update_state(paths, context.begin)
        # `elfes preempt` may signal this task from now on (rank 0's record comes once the run is "running").
        write_pid_file(paths, context.pid_record())

    def run(self) -> dict[str, Any]:
        """The whole attempt; returns the attempt's end as a small dict, or leaves (launcher/job/attempt_end.py)."""
        context = self.context
        try:
            spec = context.job_spec()
            log.info(f"elfes: attempt {context.attempt_number} ({context.launch}) of {context.paths.run_dir}: rank "
                     f"{context.start.rank} of {context.start.world_size} on {context.start.host}, {context.executor} "
                     f"job {context.start.job_id}; requeues used {context.requeues_used} of {context.max_requeues}, "
                     f"failures retried {context.failures_used} of {context.max_failures}")
            self._prepare_process(spec)
            # The rendezvous port of this start: rank 0 holds it for as long as the attempt runs.
            rendezvous = reserve_rendezvous_port(context.paths, context.start, context.token)
            export_distributed_environment(gpus_per_node=spec.resources.gpus_per_node, master_port=rendezvous.port)
            if context.requeues_used > context.max_requeues:
                # SLURM requeued the job by itself (preemption, node failure) past the cap: do not train.
                decision = Decision(run_state.Outcome.STOPPED, error=(
                    f"requeue limit exceeded: this start is requeue {context.requeues_used} of "
                    f"requeue.max_requeues={context.max_requeues} (SLURM requeued the job itself); "
                    "`elfes resume RUN_DIR` continues from last"))
                return finish_attempt(context, decision, step=None, task=self.task)
            end = self._run_command(spec) if spec.command else self._run_entrypoint(spec)
        except BaseException as error:
            if isinstance(error, SystemExit) and error.code in (None, 0):
                remove_pid_file(context.paths, context.start.rank)
                raise
            handled = self.failures.handle(self.failures.report(error))
            remove_pid_file(context.paths, context.start.rank)
            if handled.retried:
                # Requeued from `last`: leave as a requeue does (a result pickle would end the job failed).
                raise SystemExit(exit_code(context.executor, relaunched=True)) from None
            raise
        decision = decide(end.stop_reason, requeue_signal_name=context.requeue_signal_name,
                          cancel_requested=cancel_requested(context.paths, context.state_at_start),
                          requeues_used=context.requeues_used, max_requeues=context.max_requeues)
        if end.note and decision.error is None:
            decision = dataclasses.replace(decision, error=end.note)
        return finish_attempt(context, decision, step=end.step, task=self.task)

    def _prepare_process(self, spec: JobSpec) -> None:
        """The spec's ``env`` applied; the code snapshot the run records (else ``workdir``) the working folder and
        first on ``sys.path``, where the working tree it copies is no longer."""
        for name, value in (spec.env or {}).items():
            os.environ[str(name)] = str(value)
        if spec.tracking.trackers:  # the RunLogger of the entrypoint or command mirrors to them
            os.environ[TRACKING_VARIABLE] = spec.tracking.model_dump_json()
            group = tracker_group(self.context.paths.run_dir)  # one tracker group per sweep
            if group is not None:
                os.environ[GROUP_VARIABLE] = group
        workdir = str(spec.workdir)  # the code snapshot, when the run has one
        os.chdir(workdir)
        source = self.context.recorded_workdir
        if source != workdir:
            # Nothing of the job's code may come from the working tree the snapshot copies.
            sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != source]
        if workdir not in sys.path:
            sys.path.insert(0, workdir)

    # -- entrypoint jobs ----------------------------------------------------------------------------------------
    def _run_entrypoint(self, spec: JobSpec) -> RunEnd:
        from elfes.engine import StopRequest  # torch: seconds; the flags cover this time

        context = self.context
        if spec.entrypoint is None:  # the spec's validation makes a job either an entrypoint or a command
            raise ValueError(f"{context.paths.spec}: neither entrypoint nor command is set; give one of them")
        main = load_entrypoint(spec.entrypoint)
        self._record_provenance(spec)  # torch is imported now: its versions, threads and device are known
        try:
            resume_from, note = resume_point(context.paths)  # refuses a `last` that is not this run's
        except Exception:
            self.failures.final_reason = "the checkpoint to resume from was refused; a retry would refuse it again"
            raise
        if note is not None:
            log.info(f"elfes: {note}")
        stop = StopRequest()
        self.failures.heartbeat = stop.heartbeat
        job = Job(
            config=dict(spec.config or {}), run_dir=context.paths.run_dir, checkpoint_dir=context.paths.checkpoints,
            resume_from=resume_from, stop=stop, attempt=context.attempt_number,
            rank=context.start.rank, local_rank=context.start.local_rank, world_size=context.start.world_size,
            name=spec.name, job_id=context.start.job_id, executor=context.executor,
        )
        with stop.catch_signals(signals=self.flags.signals):
            for signum in dict.fromkeys(self.flags.received):  # arrived before the StopRequest caught them
                log.info(f"elfes: {signum.name} arrived while the engine was being imported; the trainer stops at "
                         "its first window boundary")
                stop.handle_signal(signum)
            if cancel_requested(context.paths, context.state_at_start):
                stop.handle_signal(signal.SIGTERM)  # cancelled between attempts: save at the first boundary
            with self._marking_stopping(lambda: stop.signal or stop.reason), self._hang_watchdog(spec, stop.heartbeat):
                result = main(job)
        release_process_group()
        # The trainer made every rank agree on one stop reason and returns it in its TrainState.
        if not hasattr(result, "stop_reason"):
            log.warning(f"elfes: {spec.entrypoint} returned {type(result).__name__}, not the TrainState of "
                        "trainer.train(...); the outcome follows this rank's own stop request, which other ranks may "
                        "not share. Return the TrainState.")
        return RunEnd(getattr(result, "stop_reason", stop.reason), getattr(result, "step", None))

    @contextlib.contextmanager
    def _hang_watchdog(self, spec: JobSpec, heartbeat: Any) -> Iterator[None]:
        """While ``main`` runs: with ``requeue.hang_timeout_s``, this rank's watchdog (launcher/job/watchdog.py)."""
        timeout_s = spec.requeue.hang_timeout_s
        if timeout_s is None or heartbeat is None:
            yield
            return
        context = self.context
        with HangWatchdog(heartbeat, timeout_s=timeout_s, startup_timeout_s=spec.requeue.startup_timeout_s,
                          paths=context.paths, attempt=context.attempt_number, rank=context.start.rank,
                          host=context.start.host, world_size=context.start.world_size, on_hang=self._hung):
            yield

    def _hung(self, report: FailureReport) -> None:
        """The watchdog's end of a hung attempt (its thread; the main thread is stuck): record it like a
        failure and leave at once, as a retried failure leaves or, not retried, with exit code 1."""
        context = self.context
        handled = self.failures.handle(report)
        remove_pid_file(context.paths, context.start.rank)
        if backend_for(context.executor).runs_here and handled.decided_here:
            end_stuck_peers(context.paths, attempt=context.attempt_number, rank=context.start.rank)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code(context.executor, relaunched=handled.retried))

    # -- command jobs -------------------------------------------------------------------------------------------
    def _run_command(self, spec: JobSpec) -> RunEnd:
        context = self.context
        self._record_provenance(spec)
        if cancel_requested(context.paths, context.state_at_start):
            self.flags.received.append(signal.SIGTERM)  # cancelled between attempts: stop at the first boundary
        end = run_command(spec.render_command(python=sys.executable), paths=context.paths, flags=self.flags,
                          executor=context.executor, started_at=context.started_at, rank=context.start.rank,
                          attempt=context.attempt_number, kill_wait_s=spec.resources.kill_wait_s,
                          watching=self._marking_stopping,
                          cancelling=lambda: cancel_requested(context.paths, context.state_at_start))
        return RunEnd(end.stop_reason, end.step, end.note)

    # -- recording ----------------------------------------------------------------------------------------------
    def _record_provenance(self, spec: JobSpec) -> None:
        """Every rank records where it computes (host and device); rank 0 also what the attempt runs on
        (launcher/rundir/provenance.py). Each names in its log what changed since the previous attempt that threatens
        a bitwise resume. A rank records after reading rank 0's rendezvous port, so after rank 0 began the attempt in
        ``state.json``. A failure to record only warns."""
        context, start = self.context, self.context.start
        gpus = spec.resources.gpus_per_node > 0
        place = rank_place(rank=start.rank, local_rank=start.local_rank, host=start.host, gpus=gpus)
        provenance = collect(code=load_code_record(context.paths), local_rank=start.local_rank, gpus=gpus) \
            if context.is_main else None

        def record(state: run_state.RunState) -> run_state.RunState:
            state = run_state.record_rank_place(state, token=context.token, place=place)
            if provenance is None:
                return state
            return run_state.record_provenance(state, token=context.token, provenance=provenance)

        try:
            state = run_state.update_recorded_state(context.paths, record)
        except (OSError, run_state.RunDamaged, run_state.NotNow) as error:
            log.warning(f"elfes: the provenance of attempt {context.attempt_number} was not recorded on rank "
                        f"{start.rank}: {error}")
            return
        log.info(f"elfes: attempt {context.attempt_number} runs rank {start.rank} on {place.describe()}")
        if context.is_main:  # for the attempt's tracker mirror: RUNNING, the earlier attempts' ends, the provenance
            publish_lifecycle(context.paths, spec, state, send=False)
        changes = place_changes_at(state, context.attempt_number, start.rank)
        if provenance is not None:
            log.info(f"elfes: attempt {context.attempt_number} runs on {provenance.describe()}")
            changes = changes_at(state, context.attempt_number) + changes
        for change in changes:
            log.warning(f"elfes: {change}")

    @contextlib.contextmanager
    def _marking_stopping(self, probe: Callable[[], str | None]) -> Iterator[None]:
        """On rank 0, mark the run "stopping" as soon as ``probe`` names a stop (a thread; the handlers only flag)."""
        if not self.context.is_main:
            yield
            return
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.2):
                name = probe()
                if name is not None:
                    def stopping(state: run_state.RunState, signal: str = name) -> run_state.RunState:
                        return run_state.mark_stopping(state, signal=signal)

                    run_state.update_recorded_state(self.context.paths, stopping)
                    return

        thread = threading.Thread(target=watch, name="elfes-stopping", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
