"""What runs inside the job, on every task: signals, the entrypoint or command, the outcome, the requeue.

``JobRuntime(run_dir)`` is what the launcher submits through submitit; each task (rank) unpickles it
and calls it. In order, on every rank:

1. Flag-only handlers for SIGTERM, SIGINT and the requeue signal (submitit's, SIGUSR2 unless
   ``SUBMITIT_PREEMPT_SIGNAL`` says otherwise) replace submitit's own (which would checkpoint and exit
   inside the handler). Nothing else happens in a handler.
2. The start is identified (job id and restart number, the same on every rank), numbered (attempts
   count from 1 across the whole run, ``elfes resume`` included), the rank's standard streams go to
   ``logs/attempt-<A>/rank-<R>.out|err``, and the task's pid is recorded (``pids/rank-<R>.json``) so
   ``elfes preempt`` can signal it. Rank 0 records the attempt in ``state.json``.
3. The spec's ``env`` is applied, the code snapshot the run records (``code.json``; else ``workdir``) becomes
   the working folder and goes on ``sys.path``, where the working tree it copies is no longer,
   the torch distributed variables are exported (submitit's ``TorchDistributedEnvironment``) and,
   with ``gpus_per_node: 0``, ``ACCELERATE_USE_CPU=1`` (so a plain ``Accelerator()`` forms a gloo group).
4. ``entrypoint``: the engine is imported (torch, seconds), a ``StopRequest`` takes over the signals
   (those that arrived during the import are handed to it) and ``main(job)`` runs with a :class:`Job`.
   ``command``: the command runs as the leader of a process group of its own; stop signals are
   forwarded to the whole group, which is reaped before the outcome is told by its exit code (0
   finished; 128 + a stop signal's number paused; anything else failed; launcher/job/command.py).
5. The outcome, the same on every rank (the trainer agrees on one stop reason for all ranks; see
   :func:`decide`): finished; requeued (the requeue signal, while requeues are left: SLURM: rank 0 runs
   ``scontrol requeue`` and every rank exits through ``SystemExit``; local: every rank exits 144 and
   submitit's controller relaunches, or, past its six starts, rank 0 resubmits into the same run
   directory); stopped or cancelled (SIGTERM/SIGINT, or no requeue left: ``last`` is saved; locally the
   task returns; under SLURM a stopped task waits until SLURM ends it, so that a preempted job is
   requeued by SLURM, while a cancelled attempt (the cancel marker) has rank 0 ``scancel`` the job and
   every rank return, so that it never comes back; a cancel marker seen right before ``scontrol
   requeue`` turns the requeue into a cancel); failed (an exception, a nonzero exit, a lost rank, a hang:
   every failing rank publishes its report, and the first to fail records the attempt's end and decides
   whether it is retried, launcher/job/failures.py; that rank then carries the retry out, or ends a
   multi-task SLURM job whose failure is not retried with ``scancel``, so that no healthy rank waits on
   for the failed one until the time limit, launcher/job/failed_attempt.py).

The rooms below it, one job each: launcher/job/signals.py (the stop signals and the flag-only
handlers), launcher/job/distributed_env.py (who this task is and the torch distributed environment),
launcher/rundir/task_files.py (the task's logs, pid file, cancel marker), launcher/job/command.py (running a
``command:``), launcher/job/outcome.py (what an attempt's end means, pure), launcher/job/failures.py (what a
failure means, pure), launcher/job/failed_attempt.py (acting on a failure) and launcher/job/requeue.py
(carrying an end out on SLURM or locally). This module ties them together for one attempt.

This module imports neither torch nor the engine at import time: the submitter pickles
``JobRuntime`` by reference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rundir import state as run_state
from ..rundir.code_record import job_spec, load_code_record
from ..rundir.paths import RunPaths
from ..rundir.provenance import changes_at
from ..rundir.state import Failure
from ..rundir.task_files import cancel_requested, redirect_standard_streams, remove_pid_file, write_pid_file
from ..spec import JobSpec
from .command import run_command
from .distributed_env import RendezvousPort, detect_start, export_distributed_environment, reserve_rendezvous_port
from .failed_attempt import (
    awaited_exit_status,
    carry_out_retry,
    end_unretried_slurm_job,
    excludes_nodes,
    publish_failure,
    with_exclusions,
)
from .failures import (
    FailureReport,
    cause_of,
    decide_failure,
    failed_nodes,
    failure_error,
    rank_records,
    read_reports,
    the_rank_that_failed,
)
from .outcome import Decision, decide
from .provenance import collect
from .requeue import (
    LOCAL_MAX_STARTS,
    LOCAL_REQUEUE_EXIT_CODE,
    cancel_slurm_job,
    requeue_slurm_job,
    resubmit_local,
    wait_for_slurm_to_end_the_job,
)
from .resume_point import resume_point
from .signals import TERMINATING_SIGNALS, SignalFlags, requeue_signal, stop_signals
from .watchdog import HangWatchdog, end_stuck_peers

# -- the entrypoint's argument -------------------------------------------------------------------------------


@dataclass
class Job:
    """What ``main(job)`` gets, on every rank. ``main`` returns the ``TrainState`` of ``trainer.train``.

    >>> def main(job):
    ...     accelerator = Accelerator()                # the process group forms from the exported env
    ...     trainer = Trainer(accelerator, ...)
    ...     with RunLogger(job.run_dir, is_main_process=accelerator.is_main_process) as logger:
    ...         return trainer.train(TrainConfig(**job.config), checkpoint_dir=job.checkpoint_dir,
    ...                              resume_from=job.resume_from, stop=job.stop)
    """

    config: dict[str, Any]  # the spec's `config`, a plain dict
    run_dir: Path
    checkpoint_dir: Path  # RUN_DIR/checkpoints
    # RUN_DIR/checkpoints/last, or the run's newest complete checkpoint when `last` is missing or dangling;
    # None before the run published one (launcher/job/resume_point.py)
    resume_from: Path | None
    stop: Any  # an elfes.engine.StopRequest, already catching SIGINT, SIGTERM and the requeue signal
    attempt: int  # starts of this run, from 1, counting on across requeues and `elfes resume`
    rank: int
    local_rank: int
    world_size: int
    name: str = ""
    job_id: str = ""
    executor: str = ""


def load_entrypoint(entrypoint: str) -> Callable[[Job], Any]:
    """Import ``"package.module:function"`` and return the function."""
    module_name, _, function_name = entrypoint.partition(":")
    module = importlib.import_module(module_name)
    try:
        function = getattr(module, function_name)
    except AttributeError:
        raise AttributeError(
            f"entrypoint {entrypoint!r}: module {module_name} has no attribute {function_name!r}; "
            f"define `def {function_name}(job):` there or fix the spec's entrypoint"
        ) from None
    if not callable(function):
        raise TypeError(f"entrypoint {entrypoint!r} is a {type(function).__name__}, not a function")
    return function


# -- the callable submitit runs ---------------------------------------------------------------------------------


class JobRuntime:
    """The callable the launcher submits: ``executor.submit(JobRuntime(run_dir))``. Every task calls it.

    Returns a small plain dict (``{"outcome", "attempt", "step"}``) when the attempt ends without a
    requeue; exits through ``SystemExit`` when it requeues; re-raises a user error after recording it.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = str(Path(run_dir).resolve())

    def __repr__(self) -> str:
        return f"JobRuntime({self.run_dir!r})"

    def __call__(self) -> dict[str, Any]:
        flags = SignalFlags(stop_signals()).install()  # first act: flags only, replacing submitit's handlers
        return _Attempt(RunPaths(self.run_dir), flags).run()


class _Attempt:
    """One task's part of one attempt (start) of the job."""

    def __init__(self, paths: RunPaths, flags: SignalFlags) -> None:
        self.paths = paths
        self.flags = flags
        self.requeue_name = requeue_signal().name
        # Every rank derives the attempt number, its launch and the requeues used from the same
        # state.json content, whether or not rank 0 has recorded this start yet.
        self.before = run_state.load_state(paths)
        submissions = len(self.before.submissions) if self.before is not None else 0
        self.start = detect_start(paths, submissions)
        self.is_main = self.start.rank == 0
        self.token = self.start.token(submissions)
        self.command_note: str | None = None  # a command job's note on how its stop ended (launcher/job/command.py)
        self.rendezvous: RendezvousPort | None = None  # rank 0 holds the port until the task exits
        self.attempt = run_state.attempt_number(self.before, self.token)
        self.launch = "requeue" if self.start.restart > 0 else run_state.latest_submission_kind(self.before)
        self.requeues_used = run_state.requeues_used_by(self.before, self.token, self.launch)
        self.failures_used = run_state.failures_used_by(self.before, self.token, self.launch)
        self.previous = run_state.previous_attempt(self.before, self.token)
        self.spec: JobSpec | None = None  # until run() reads it; a failure may come before that
        self.max_failures = 0  # until the spec is read: a failure before that is not retried
        self.heartbeat: Any = None  # the engine's Heartbeat of an entrypoint job (its StopRequest's)
        self.failing = threading.Lock()  # one failure path per task (the main thread's or the watchdog's)
        self.decider = False  # this rank ended the attempt as failed (and carries a retry out)
        self.final_failure: str | None = None  # why a failure now cannot pass on a retry
        self.started_at = run_state.now()
        redirect_standard_streams(paths, attempt=self.attempt, rank=self.start.rank)
        if self.is_main:
            self._update(lambda s: run_state.begin_attempt(
                s, token=self.token, job_id=self.start.job_id, launch=self.launch,
                hosts=self.start.hosts, world_size=self.start.world_size))
        # `elfes preempt` may signal this task from now on (rank 0's record comes once the run is "running").
        write_pid_file(paths, {"host": self.start.host, "attempt": self.attempt, "rank": self.start.rank,
                               "job_id": self.start.job_id, "executor": self.start.executor})

    # -- the whole attempt --------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        try:
            recorded = _load_spec(self.paths)
            self.recorded_workdir = str(recorded.workdir)  # the working tree a code snapshot copies
            self.spec = job_spec(recorded, self.paths)  # its workdir: the code snapshot, when the run has one
            self.max_requeues = self.spec.requeue.max_requeues
            self.max_failures = self.spec.requeue.max_failures
            print(f"elfes: attempt {self.attempt} ({self.launch}) of {self.paths.run_dir}: rank {self.start.rank} of "
                  f"{self.start.world_size} on {self.start.host}, {self.start.executor} job {self.start.job_id}; "
                  f"requeues used {self.requeues_used} of {self.max_requeues}, failures retried "
                  f"{self.failures_used} of {self.max_failures}", flush=True)
            self._prepare_process()
            if self.requeues_used > self.max_requeues:
                # SLURM requeued the job by itself (preemption, node failure) past the cap: do not train.
                decision = Decision("stopped", error=(
                    f"requeue limit exceeded: this start is requeue {self.requeues_used} of requeue.max_requeues="
                    f"{self.max_requeues} (SLURM requeued the job itself); `elfes resume RUN_DIR` continues from last"))
                return self._finish(decision, step=None)
            if self.spec.command:
                stop_reason, step = self._run_command()
            else:
                stop_reason, step = self._run_entrypoint()
        except BaseException as error:
            if isinstance(error, SystemExit) and error.code in (None, 0):
                remove_pid_file(self.paths, self.start.rank)
                raise
            failure = self._fail(self._report(error))
            remove_pid_file(self.paths, self.start.rank)
            if failure is not None and failure.retried:
                # Requeued from `last`: leave as a requeue does (a result pickle would end the job failed).
                raise SystemExit(LOCAL_REQUEUE_EXIT_CODE if self.start.executor == "local" else 0) from None
            raise
        decision = decide(stop_reason, requeue_signal_name=self.requeue_name,
                          cancel_requested=cancel_requested(self.paths, self.before),
                          requeues_used=self.requeues_used, max_requeues=self.max_requeues)
        if self.command_note and decision.error is None:
            decision = dataclasses.replace(decision, error=self.command_note)
        return self._finish(decision, step=step)

    def _prepare_process(self) -> None:
        for name, value in (self.spec.env or {}).items():
            os.environ[str(name)] = str(value)
        workdir = str(self.spec.workdir)  # the code snapshot, when the run has one
        os.chdir(workdir)
        source = self.recorded_workdir
        if source != workdir:
            # Nothing of the job's code may come from the working tree the snapshot copies.
            sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != source]
        if workdir not in sys.path:
            sys.path.insert(0, workdir)
        self.rendezvous = reserve_rendezvous_port(self.paths, self.start, self.token)
        export_distributed_environment(gpus_per_node=self.spec.resources.gpus_per_node,
                                       master_port=self.rendezvous.port)

    # -- entrypoint jobs ----------------------------------------------------------------------------------------
    def _run_entrypoint(self) -> tuple[str | None, int | None]:
        from elfes.engine import StopRequest  # torch: seconds; the flags cover this time

        main = load_entrypoint(self.spec.entrypoint)
        self._record_provenance()  # torch is imported now: its versions, threads and device are known
        try:
            resume_from, note = resume_point(self.paths)  # refuses a `last` that is not this run's
        except Exception:
            self.final_failure = "the checkpoint to resume from was refused; a retry would refuse it again"
            raise
        if note is not None:
            print(f"elfes: {note}", flush=True)
        stop = StopRequest()
        self.heartbeat = stop.heartbeat
        job = Job(
            config=dict(self.spec.config or {}), run_dir=self.paths.run_dir, checkpoint_dir=self.paths.checkpoints,
            resume_from=resume_from, stop=stop, attempt=self.attempt,
            rank=self.start.rank, local_rank=self.start.local_rank, world_size=self.start.world_size,
            name=self.spec.name, job_id=self.start.job_id, executor=self.start.executor,
        )
        with stop.catch_signals(signals=self.flags.signals):
            for signum in dict.fromkeys(self.flags.received):  # arrived before the StopRequest caught them
                print(f"elfes: {signum.name} arrived while the engine was being imported; the trainer stops at "
                      "its first window boundary", flush=True)
                stop.handle_signal(signum)
            if cancel_requested(self.paths, self.before):
                stop.handle_signal(signal.SIGTERM)  # cancelled between attempts: save at the first boundary
            with self._stopping_watcher(lambda: stop.signal or stop.reason), self._hang_watchdog():
                result = main(job)
        release_process_group()
        # The trainer made every rank agree on one stop reason and returns it in its TrainState.
        if not hasattr(result, "stop_reason"):
            print(f"elfes: warning: {self.spec.entrypoint} returned {type(result).__name__}, not the TrainState of "
                  "trainer.train(...); the outcome follows this rank's own stop request, which other ranks may "
                  "not share. Return the TrainState.", file=sys.stderr, flush=True)
        stop_reason = getattr(result, "stop_reason", stop.reason)
        return stop_reason, getattr(result, "step", None)

    # -- command jobs -------------------------------------------------------------------------------------------
    def _run_command(self) -> tuple[str | None, int | None]:
        self._record_provenance()
        if cancel_requested(self.paths, self.before):
            self.flags.received.append(signal.SIGTERM)  # cancelled between attempts: stop at the first boundary
        end = run_command(self.spec.render_command(python=sys.executable), paths=self.paths, flags=self.flags,
                          executor=self.start.executor, started_at=self.started_at, rank=self.start.rank,
                          attempt=self.attempt, kill_wait_s=self.spec.resources.kill_wait_s,
                          watching=self._stopping_watcher,
                          cancelling=lambda: cancel_requested(self.paths, self.before))
        self.command_note = end.note
        return end.stop_reason, end.step

    # -- recording and acting -----------------------------------------------------------------------------------
    def _record_provenance(self) -> None:
        """Rank 0: record what this attempt runs on (launcher/rundir/provenance.py) and name in its log what changed
        since the previous attempt that threatens a bitwise resume. A failure to record only warns."""
        if not self.is_main:
            return
        try:
            provenance = collect(code=load_code_record(self.paths), local_rank=self.start.local_rank)
            state = run_state.update_state(self.paths, lambda s: run_state.record_provenance(
                s, token=self.token, provenance=provenance))
        except (OSError, run_state.StateError) as error:
            print(f"elfes: warning: the provenance of attempt {self.attempt} was not recorded: {error}",
                  file=sys.stderr, flush=True)
            return
        print(f"elfes: attempt {self.attempt} runs on {provenance.describe()}", flush=True)
        for change in changes_at(state, self.attempt):
            print(f"elfes: warning: {change}", file=sys.stderr, flush=True)

    def _update(self, change: Callable[[run_state.RunState | None], run_state.RunState]) -> None:
        run_state.update_state(self.paths, change)

    class _Watcher:
        def __init__(self, attempt: _Attempt, probe: Callable[[], str | None]) -> None:
            self.attempt, self.probe = attempt, probe
            self.done = threading.Event()
            self.thread = threading.Thread(target=self._watch, name="elfes-stopping", daemon=True)

        def _watch(self) -> None:
            while not self.done.wait(0.2):
                name = self.probe()
                if name is not None:
                    self.attempt._update(lambda s, name=name: run_state.mark_stopping(s, signal=name))
                    return

        def __enter__(self) -> None:
            if self.attempt.is_main:
                self.thread.start()

        def __exit__(self, *exc_info: object) -> None:
            self.done.set()
            if self.thread.is_alive():
                self.thread.join()

    def _stopping_watcher(self, probe: Callable[[], str | None]) -> _Attempt._Watcher:
        """On rank 0, mark the run "stopping" as soon as a stop is requested (a thread; the handlers only flag)."""
        return self._Watcher(self, probe)

    # -- failures -----------------------------------------------------------------------------------------------
    def _report(self, error: BaseException) -> FailureReport:
        """This rank's report of ``error``: a command's failed exit, or an exception (a peer's loss when a
        collective says so), at the step the heartbeat shows."""
        heartbeat = self.heartbeat
        report = FailureReport.of_exception(
            error, rank=self.start.rank, host=self.start.host, at=time.time(),
            step=heartbeat.failing_step() if heartbeat is not None else None,
            updated=heartbeat is not None and heartbeat.updates > 0)
        if self.final_failure is not None:
            report = dataclasses.replace(report, final=self.final_failure)
        elif isinstance(error, KeyboardInterrupt):  # a second SIGINT asked for no save
            report = dataclasses.replace(report, final="interrupted on purpose (a second SIGINT), not a failure")
        if self.spec is not None and self.spec.command and isinstance(error, RuntimeError) and not report.peer_lost:
            report = dataclasses.replace(report, category="exit")
        return report

    def _fail(self, report: FailureReport) -> Failure | None:
        """Report this rank's failure; the first rank to fail ends the attempt "failed" with the attempt's
        cause and decides whether it is retried (launcher/job/failures.py); the others read that decision.
        Returns it (None where state.json could not take it). The decider carries it out: a retry, or the end
        of a multi-task SLURM job (launcher/job/failed_attempt.py). Main thread or hang watchdog."""
        with self.failing:
            publish_failure(self.paths, self.attempt, report, world_size=self.start.world_size)
            decided: list[Failure | None] = []

            def end(state: run_state.RunState | None) -> run_state.RunState:
                if state is None:
                    raise run_state.StateError("state.json is missing")
                state = run_state.begin_attempt(  # a no-op once rank 0 recorded the start (the usual case)
                    state, token=self.token, job_id=self.start.job_id, launch=self.launch, hosts=self.start.hosts,
                    world_size=self.start.world_size)
                attempt = next(a for a in state.attempts if a.token == self.token)
                if attempt.ended:
                    decided.append(attempt.failure)
                    return state
                reports = read_reports(self.paths, self.attempt) or [report]
                records = rank_records(self.paths, self.attempt)
                cause = the_rank_that_failed(
                    cause_of(reports), reports, world_size=self.start.world_size,
                    hosts={rank: record["host"] for rank, record in records.items()},
                    gone=lambda rank: self._process_gone(records.get(rank)),
                    exit_status=lambda rank: awaited_exit_status(self.paths, self.start, records.get(rank)))
                failure = decide_failure(cause, previous=self.previous, failures_used=self.failures_used,
                                         max_failures=self.max_failures)
                failure = dataclasses.replace(failure, nodes=failed_nodes(
                    cause, reports, hosts=tuple(self.start.hosts),
                    ranks={rank: record["host"] for rank, record in records.items()}))
                decided.append(failure)
                self.decider = True
                state = run_state.end_attempt(state, token=self.token, outcome="failed",
                                              error=failure_error(failure, cause), failure=failure)
                return with_exclusions(state, failure, attempt=self.attempt, previous=self.previous,
                                       excluding=excludes_nodes(self.start.executor, self.spec),
                                       final=cause.final is not None)

            self.decider = False
            try:
                self._update(end)
            except Exception as error:  # never lose the failure itself to a failure to record it
                print(f"elfes: the failure could not be recorded in state.json ({type(error).__name__}: {error})",
                      file=sys.stderr, flush=True)
                return None
            failure = decided[-1] if decided else None
            if self.decider and failure is not None:
                if failure.retried:
                    failure = carry_out_retry(failure, paths=self.paths, start=self.start, token=self.token,
                                              spec=self.spec, task=JobRuntime(str(self.paths.run_dir)))
                end_unretried_slurm_job(failure, self.start)
            print(f"elfes: attempt {self.attempt} ended failed on rank {self.start.rank}"
                  + ("; retried from `last`" if failure is not None and failure.retried else
                     f"; not retried ({failure.reason})" if failure is not None and failure.reason else ""), flush=True)
            return failure

    def _process_gone(self, record: dict | None) -> bool:
        """Whether the task of a pid record (``RunPaths.pid_file``) is known to have ended: one on this host only."""
        if record is None or record.get("host") != self.start.host or not isinstance(record.get("pid"), int):
            return False
        try:
            os.kill(record["pid"], 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False

    @contextlib.contextmanager
    def _hang_watchdog(self) -> Iterator[None]:
        """While ``main`` runs: with ``requeue.hang_timeout_s``, this rank's watchdog (launcher/job/watchdog.py)."""
        timeout_s = self.spec.requeue.hang_timeout_s
        if timeout_s is None or self.heartbeat is None:
            yield
            return
        watchdog = HangWatchdog(self.heartbeat, timeout_s=timeout_s,
                                startup_timeout_s=self.spec.requeue.startup_timeout_s, paths=self.paths,
                                attempt=self.attempt, rank=self.start.rank, host=self.start.host,
                                world_size=self.start.world_size, on_hang=self._hung)
        with watchdog:
            yield

    def _hung(self, report: FailureReport) -> None:
        """The watchdog's end of a hung attempt (its thread; the main thread is stuck): record it like a
        failure and leave at once, as a retried failure leaves (exit 144 locally) or failed (exit 1)."""
        failure = self._fail(report)
        remove_pid_file(self.paths, self.start.rank)
        retried = failure is not None and failure.retried
        if self.start.executor == "local" and self.decider:
            end_stuck_peers(self.paths, attempt=self.attempt, rank=self.start.rank)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(LOCAL_REQUEUE_EXIT_CODE if retried and self.start.executor == "local" else (0 if retried else 1))

    def _finish(self, decision: Decision, *, step: int | None) -> dict[str, Any]:
        """Record the outcome (rank 0) and act on it (every rank alike)."""
        slurm = self.start.executor == "slurm"
        if decision.requeue and slurm and self.is_main:
            if cancel_requested(self.paths, self.before):
                # `elfes cancel` came while the job stopped for a requeue: the cancel wins (a requeued job
                # would come back, and scontrol requeue also requeues a job that scancel is ending).
                decision = Decision("cancelled", signal=decision.signal)
            elif (refused := requeue_slurm_job(self.start.job_id)) is not None:
                decision = Decision("stopped", signal=decision.signal, error=refused)
        resubmit = (decision.requeue and self.start.executor == "local"
                    and self.start.restart + 1 >= LOCAL_MAX_STARTS)
        if self.is_main:
            self._update(lambda s: run_state.end_attempt(
                s, token=self.token, outcome=decision.outcome, signal=decision.signal, step=step,
                error=decision.error))
            if resubmit:
                resubmit_local(self.paths, JobRuntime(str(self.paths.run_dir)))
        print(f"elfes: attempt {self.attempt} ended {decision.outcome}"
              + (f" ({decision.signal})" if decision.signal else "") + (f" at step {step}" if step is not None else "")
              + (f": {decision.error}" if decision.error else ""), flush=True)
        remove_pid_file(self.paths, self.start.rank)
        if decision.requeue:
            # Every rank leaves through SystemExit: a rank that returned would write a success result
            # for an attempt that is being relaunched.
            raise SystemExit(LOCAL_REQUEUE_EXIT_CODE if self.start.executor == "local" else 0)
        if slurm and decision.outcome == "cancelled":
            # Cancelled for good: rank 0 scancels the job (it may have come back through a requeue that beat
            # the cancel) and every rank exits, which frees the allocation now; an exit is never requeued.
            if self.is_main:
                cancel_slurm_job(self.start.job_id)
        elif slurm and decision.signal in TERMINATING_SIGNALS:
            # A job that exits during a preemption's grace time is not requeued; one that SLURM kills
            # is (PreemptMode=REQUEUE). So wait to be ended.
            wait_for_slurm_to_end_the_job()
        return {"outcome": decision.outcome, "attempt": self.attempt, "step": step}


def release_process_group() -> None:
    """Tear down the torch process group that ``main`` formed, and free it now, before the task exits.

    Freed only at interpreter shutdown, a gloo worker thread that releases a collective's tensors then
    aborts the process (SIGABRT), which would turn a finished or requeued attempt into a failed one.
    ``accelerator.end_training()`` destroys the group, but the DDP wrappers the accelerator keeps may
    still reference it (collected here), and the engine holds it past its wrapper, so that the
    wrapper's Reducer, which would free it with the GIL held while a gloo worker waits for the GIL, is
    never the last to let go (elfes/engine/process_group.py). Dropped here, it is freed with the GIL
    released, and gloo's threads are joined.
    """
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not distributed.is_available():
        return
    if distributed.is_initialized():
        distributed.destroy_process_group()
    gc.collect()
    if "elfes.engine.process_group" in sys.modules:  # the engine trained in this process
        from elfes.engine.process_group import release_process_groups

        release_process_groups()


def _load_spec(paths: RunPaths) -> Any:
    """The spec as submitted (``RUN_DIR/job.yaml``, every path absolute)."""
    from ..spec import load_spec

    return load_spec(paths.spec, check_files=False)
