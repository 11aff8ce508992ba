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
3. The spec's ``env`` is applied, ``workdir`` becomes the working folder and goes on ``sys.path``,
   the torch distributed variables are exported (submitit's ``TorchDistributedEnvironment``) and,
   with ``gpus_per_node: 0``, ``ACCELERATE_USE_CPU=1`` (so a plain ``Accelerator()`` forms a gloo group).
4. ``entrypoint``: the engine is imported (torch, seconds), a ``StopRequest`` takes over the signals
   (those that arrived during the import are handed to it) and ``main(job)`` runs with a :class:`Job`.
   ``command``: the command runs as a child process; stop signals are forwarded to it and its exit
   code tells the outcome (0 finished; 128 + a stop signal's number paused; anything else failed).
5. The outcome, the same on every rank (the trainer agrees on one stop reason for all ranks; see
   :func:`decide`): finished; requeued (the requeue signal, while requeues are left: SLURM: rank 0 runs
   ``scontrol requeue`` and every rank exits through ``SystemExit``; local: every rank exits 144 and
   submitit's controller relaunches, or, past its six starts, rank 0 resubmits into the same run
   directory); stopped or cancelled (SIGTERM/SIGINT, or no requeue left: ``last`` is saved; locally the
   task returns, under SLURM it waits until SLURM ends it, so that a preempted job is requeued by SLURM
   and a cancelled one stays cancelled); failed (an exception in user code: recorded with its message
   on rank 0, re-raised, never requeued).

This module imports neither torch nor the engine at import time: the submitter pickles
``JobRuntime`` by reference.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

from elfes.files import write_text_atomically

from . import state as run_state
from .paths import RunPaths

# submitit's local controller relaunches all tasks when any exits with this code
# (submitit.local.local.LOCAL_REQUEUE_RETURN_CODE).
LOCAL_REQUEUE_EXIT_CODE = 144
# submitit's local controller starts a job at most this often (Controller.run(max_retry=6)); a local
# requeue past that is a resubmission into the same run directory.
LOCAL_MAX_STARTS = 6
TERMINATING_SIGNALS = ("SIGINT", "SIGTERM")
# A stop reason the trainer sets on a normal end (the monitor stopped improving).
FINISHING_REASONS = ("early_stopping",)
# A command job's child gets a stop signal once it catches it (it may be importing torch, when the
# default action would kill it), or after this long anyway.
FORWARD_HOLD_S = 60.0
# How often a waiting loop (the command job's, rank 0's stopping watcher) looks at its flags.
POLL_S = 0.05


def requeue_signal() -> signal.Signals:
    """The signal that asks for a requeue: submitit's (``SUBMITIT_PREEMPT_SIGNAL``, SIGUSR2 by default)."""
    from submitit.core.job_environment import JobEnvironment

    return signal.Signals(JobEnvironment._usr_sig())


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals the job turns into stops: SIGINT, SIGTERM and the requeue signal."""
    return tuple(dict.fromkeys((signal.SIGINT, signal.SIGTERM, requeue_signal())))


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
    resume_from: Path | None  # RUN_DIR/checkpoints/last when it exists
    stop: Any  # an elfes.engine.StopRequest, already catching SIGINT, SIGTERM and the requeue signal
    attempt: int  # starts of this run, from 1, counting on across requeues and `elfes resume`
    rank: int
    local_rank: int
    world_size: int
    name: str = ""
    job_id: str = ""
    executor: str = ""


# -- the outcome (pure) --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What an attempt's end means: its ``outcome`` (a ``state.OUTCOMES`` value), the signal behind it
    and, when a requeue was refused, why."""

    outcome: str
    signal: str | None = None
    error: str | None = None

    @property
    def requeue(self) -> bool:
        return self.outcome == "requeued"


def decide(
    stop_reason: str | None,
    *,
    requeue_signal_name: str,
    cancel_requested: bool,
    requeues_used: int,
    max_requeues: int,
) -> Decision:
    """The outcome of an attempt that returned with ``stop_reason`` (the reason all ranks agreed on).

    Every rank calls it with the same arguments, so every rank takes the same action. ``requeues_used``
    counts this attempt's own launch if it was a requeue. The cancel marker only tells a cancel from a
    stop: a requeue already agreed on goes ahead (the relaunch sees the marker and stops at once).
    """
    if stop_reason is None or stop_reason in FINISHING_REASONS:
        return Decision("finished")
    if stop_reason == requeue_signal_name:
        if requeues_used < max_requeues:
            return Decision("requeued", signal=stop_reason)
        return Decision(
            "stopped", signal=stop_reason,
            error=f"requeue limit reached ({requeues_used} of requeue.max_requeues={max_requeues} used); `last` is "
                  "saved: `elfes resume RUN_DIR` continues the run (raise requeue.max_requeues for more automatic requeues)",
        )
    name = stop_reason if stop_reason in TERMINATING_SIGNALS else None
    return Decision("cancelled" if cancel_requested else "stopped", signal=name)


def stop_reason_from_exit_code(returncode: int, *, stop_signal_names: Iterable[str]) -> str | None:
    """A command's exit code as a stop reason: 0 -> None (finished), 128 + a stop signal's number ->
    that signal's name (paused). Raises ``RuntimeError`` (the attempt failed) for anything else."""
    names = tuple(stop_signal_names)
    if returncode == 0:
        return None
    if returncode > 128:
        try:
            name = signal.Signals(returncode - 128).name
        except ValueError:
            name = None
        if name in names:
            return name
    if returncode < 0:
        name = signal.Signals(-returncode).name
        raise RuntimeError(
            f"the command was killed by {name} without saving; a command job must catch "
            f"{', '.join(names)} (e.g. StopRequest().catch_signals(signals=...)), save `last` and exit with "
            "128 + the signal's number"
        )
    raise RuntimeError(
        f"the command exited with code {returncode}; 0 means finished and 128 + the number of one of "
        f"{', '.join(names)} means paused after saving `last`; see its log for the error"
    )


def catches_signal(pid: int, signum: int) -> bool | None:
    """Whether process ``pid`` has a handler for ``signum`` (Linux ``/proc/PID/status`` ``SigCgt``); None
    when that cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool((int(line.split()[1], 16) >> (int(signum) - 1)) & 1)
    return None


# -- signals before the engine ---------------------------------------------------------------------------------


class SignalFlags:
    """Flag-only handlers installed first thing in the task. The main thread acts on ``received``."""

    def __init__(self, signals: Iterable[int]) -> None:
        self.signals = tuple(signal.Signals(signum) for signum in signals)
        self.received: list[signal.Signals] = []
        self._pid = os.getpid()

    def install(self) -> SignalFlags:
        for signum in self.signals:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None = None) -> None:
        if os.getpid() != self._pid:  # a forked child (DataLoader worker) inherited the handler: ignore
            return
        self.received.append(signal.Signals(signum))

    def names(self) -> list[str]:
        return [signum.name for signum in self.received]


# -- one start of the job, as seen by one task -----------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Who and where this task is, and which start of the job it belongs to (the same on every rank)."""

    executor: str  # "local" or "slurm" (submitit's SUBMITIT_EXECUTOR)
    job_id: str
    restart: int  # 0 for the job's first start; SLURM_RESTART_COUNT, or this rank's local start count - 1
    rank: int
    local_rank: int
    world_size: int
    host: str
    hosts: tuple[str, ...]

    def token(self, submissions: int) -> str:
        """This start's name in ``state.json``: job id and restart, and the number of submissions so far
        (a local job id is a process id, which a later submission of the same run may reuse)."""
        return f"{self.job_id}:{self.restart}/{submissions}"


def _detect_start(paths: RunPaths, submissions: int) -> Start:
    from submitit.core.job_environment import JobEnvironment

    environment = JobEnvironment()
    executor = environment.name()
    rank = environment.global_rank
    if executor == "slurm":
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    elif executor == "local":
        restart = _count_local_start(paths, rank=rank, job=f"{environment.job_id}/{submissions}") - 1
    else:
        raise RuntimeError(
            f"JobRuntime runs under submitit's slurm or local executor; SUBMITIT_EXECUTOR is {executor!r}. "
            "Submit the job with `elfes submit` (--executor local or slurm)."
        )
    return Start(executor=executor, job_id=str(environment.job_id), restart=restart, rank=rank,
                 local_rank=environment.local_rank, world_size=environment.num_tasks,
                 host=socket.gethostname(), hosts=tuple(environment.hostnames))


def _count_local_start(paths: RunPaths, *, rank: int, job: str) -> int:
    """This rank's start number within local job ``job`` (its id and submission number; submitit's
    controller sets no restart count)."""
    file = paths.start_count(rank)
    try:
        recorded = json.loads(file.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        recorded = {}
    starts = recorded.get("starts", 0) + 1 if recorded.get("job") == job else 1
    file.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(file, json.dumps({"job": job, "starts": starts}) + "\n")
    return starts


def _redirect_standard_streams(paths: RunPaths, *, attempt: int, rank: int) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so children too) to the attempt's logs."""
    folder = paths.attempt_logs(attempt)
    folder.mkdir(parents=True, exist_ok=True)
    for stream, descriptor, name in ((sys.stdout, 1, "out"), (sys.stderr, 2, "err")):
        stream.flush()
        target = os.open(paths.rank_log(attempt, rank, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, descriptor)
        os.close(target)


def _write_pid_file(paths: RunPaths, start: Start, attempt: int) -> None:
    paths.pids.mkdir(parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "host": start.host, "attempt": attempt, "rank": start.rank,
              "job_id": start.job_id, "executor": start.executor, "started_at": run_state.now()}
    write_text_atomically(paths.pid_file(start.rank), json.dumps(record) + "\n")


def _remove_pid_file(paths: RunPaths, rank: int) -> None:
    file = paths.pid_file(rank)
    try:
        if json.loads(file.read_text(encoding="utf-8")).get("pid") == os.getpid():
            file.unlink()
    except (FileNotFoundError, ValueError):
        pass


def _cancel_requested(paths: RunPaths, state: run_state.RunState | None) -> bool:
    """Whether ``elfes cancel`` left its marker for the current submission (an older one is stale)."""
    try:
        marked = paths.cancel_marker.stat().st_mtime
    except FileNotFoundError:
        return False
    if state is None or not state.submissions:
        return True
    return marked >= datetime.fromisoformat(state.submissions[-1].at).timestamp()


def _saved_step_from_events(paths: RunPaths, since: str) -> int | None:
    """The step of the latest ``stopped``/``finished`` record written after ``since`` (a command job's
    own trainer wrote it), or None."""
    try:
        lines = paths.events.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill
        if event.get("event") in ("stopped", "finished") and str(event.get("time", "")) >= since:
            return (event.get("state") or {}).get("step")
    return None


def _dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the command's process get SIGTERM when this task dies (Linux
    ``PR_SET_PDEATHSIG``): a task killed by the local controller (or by hand) leaves no command behind."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the forked child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the task died before the call
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal


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
        self.start = _detect_start(paths, submissions)
        self.is_main = self.start.rank == 0
        self.token = self.start.token(submissions)
        self.attempt = run_state.attempt_number(self.before, self.token)
        self.launch = "requeue" if self.start.restart > 0 else run_state.latest_submission_kind(self.before)
        self.requeues_used = run_state.requeues_used_by(self.before, self.token, self.launch)
        self.started_at = run_state.now()
        _redirect_standard_streams(paths, attempt=self.attempt, rank=self.start.rank)
        if self.is_main:
            self._update(lambda s: run_state.begin_attempt(
                s, token=self.token, job_id=self.start.job_id, launch=self.launch,
                hosts=self.start.hosts, world_size=self.start.world_size))
        # `elfes preempt` may signal this task from now on (rank 0's record comes once the run is "running").
        _write_pid_file(paths, self.start, self.attempt)

    # -- the whole attempt --------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        try:
            self.spec = _load_spec(self.paths)
            self.max_requeues = self.spec.requeue.max_requeues
            print(f"elfes: attempt {self.attempt} ({self.launch}) of {self.paths.run_dir}: rank {self.start.rank} of "
                  f"{self.start.world_size} on {self.start.host}, {self.start.executor} job {self.start.job_id}; "
                  f"requeues used {self.requeues_used} of {self.max_requeues}", flush=True)
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
            if not isinstance(error, SystemExit):
                self._record_failure(error)
            _remove_pid_file(self.paths, self.start.rank)
            raise
        decision = decide(stop_reason, requeue_signal_name=self.requeue_name,
                          cancel_requested=_cancel_requested(self.paths, self.before),
                          requeues_used=self.requeues_used, max_requeues=self.max_requeues)
        return self._finish(decision, step=step)

    def _prepare_process(self) -> None:
        for name, value in (self.spec.env or {}).items():
            os.environ[str(name)] = str(value)
        workdir = str(self.spec.workdir)
        os.chdir(workdir)
        if workdir not in sys.path:
            sys.path.insert(0, workdir)
        if self.spec.resources.gpus_per_node == 0:
            os.environ["ACCELERATE_USE_CPU"] = "1"  # without it Accelerate forms no group on a CPU-only machine
        from submitit.helpers import TorchDistributedEnvironment

        # overwrite: a job submitted from inside another distributed job inherits its variables.
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)

    # -- entrypoint jobs ----------------------------------------------------------------------------------------
    def _run_entrypoint(self) -> tuple[str | None, int | None]:
        from elfes.engine import StopRequest  # torch: seconds; the flags cover this time

        main = load_entrypoint(self.spec.entrypoint)
        stop = StopRequest()
        job = Job(
            config=dict(self.spec.config or {}), run_dir=self.paths.run_dir, checkpoint_dir=self.paths.checkpoints,
            resume_from=self.paths.last if self.paths.last.exists() else None, stop=stop, attempt=self.attempt,
            rank=self.start.rank, local_rank=self.start.local_rank, world_size=self.start.world_size,
            name=self.spec.name, job_id=self.start.job_id, executor=self.start.executor,
        )
        with stop.catch_signals(signals=self.flags.signals):
            for signum in dict.fromkeys(self.flags.received):  # arrived before the StopRequest caught them
                print(f"elfes: {signum.name} arrived while the engine was being imported; the trainer stops at "
                      "its first window boundary", flush=True)
                stop.handle_signal(signum)
            if _cancel_requested(self.paths, self.before):
                stop.handle_signal(signal.SIGTERM)  # cancelled between attempts: save at the first boundary
            with self._stopping_watcher(lambda: stop.signal or stop.reason):
                result = main(job)
        # The trainer made every rank agree on one stop reason and returns it in its TrainState.
        if not hasattr(result, "stop_reason"):
            print(f"elfes: warning: {self.spec.entrypoint} returned {type(result).__name__}, not the TrainState of "
                  "trainer.train(...); the outcome follows this rank's own stop request, which other ranks may "
                  "not share. Return the TrainState.", file=sys.stderr, flush=True)
        stop_reason = getattr(result, "stop_reason", stop.reason)
        return stop_reason, getattr(result, "step", None)

    # -- command jobs -------------------------------------------------------------------------------------------
    def _run_command(self) -> tuple[str | None, int | None]:
        argv = self.spec.render_command(python=sys.executable)
        if _cancel_requested(self.paths, self.before):
            self.flags.received.append(signal.SIGTERM)  # cancelled between attempts: stop at the first boundary
        child = subprocess.Popen(argv, cwd=os.getcwd(), preexec_fn=_dies_with_parent())
        started = time.monotonic()
        forwarded = 0
        held: list[signal.Signals] = []
        with self._stopping_watcher(lambda: self.flags.received[0].name if self.flags.received else None):
            while child.poll() is None:
                # The handlers only record; this loop forwards. A signal waits until the child catches it
                # (it may still be importing torch, when the default action would kill it), or FORWARD_HOLD_S.
                held += self.flags.received[forwarded:]
                forwarded = len(self.flags.received)
                held = [signum for signum in held if not self._forward(child, signum, started)]
                time.sleep(POLL_S)
        names = [signum.name for signum in self.flags.signals]
        # The exit code, not this task's own flags, decides: the children's trainer made every rank
        # agree on one stop reason, while each task may have seen other signals.
        reason = stop_reason_from_exit_code(child.returncode, stop_signal_names=names)
        return reason, _saved_step_from_events(self.paths, self.started_at)

    def _forward(self, child: subprocess.Popen, signum: signal.Signals, started: float) -> bool:
        """Send ``signum`` to the command if it catches it by now (or waited too long); True once handled."""
        if signum == signal.SIGINT and self.start.executor == "slurm":
            return True  # SLURM signals every process of the step; a second SIGINT would interrupt the save
        if catches_signal(child.pid, signum) is False and time.monotonic() - started < FORWARD_HOLD_S:
            return False
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass
        return True

    # -- recording and acting -----------------------------------------------------------------------------------
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

    def _record_failure(self, error: BaseException) -> None:
        message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        print(f"elfes: attempt {self.attempt} failed on rank {self.start.rank}: {message}", file=sys.stderr, flush=True)
        if self.is_main:
            try:
                self._update(lambda s: run_state.end_attempt(s, token=self.token, outcome="failed", error=message))
            except run_state.StateError:
                pass  # already ended (the failure came after the outcome was recorded)

    def _finish(self, decision: Decision, *, step: int | None) -> dict[str, Any]:
        """Record the outcome (rank 0) and act on it (every rank alike)."""
        if decision.requeue and self.start.executor == "slurm" and self.is_main:
            from submitit.core.job_environment import JobEnvironment

            try:
                JobEnvironment()._requeue(self.max_requeues - self.requeues_used)  # scontrol requeue JOB_ID
            except (OSError, subprocess.SubprocessError) as error:
                decision = Decision("stopped", signal=decision.signal, error=(
                    f"`scontrol requeue {self.start.job_id}` failed ({error}); `last` is saved: "
                    "`elfes resume RUN_DIR` continues the run"))
        resubmit = (decision.requeue and self.start.executor == "local"
                    and self.start.restart + 1 >= LOCAL_MAX_STARTS)
        if self.is_main:
            self._update(lambda s: run_state.end_attempt(
                s, token=self.token, outcome=decision.outcome, signal=decision.signal, step=step,
                error=decision.error))
            if resubmit:
                _resubmit_local(self.paths)
        print(f"elfes: attempt {self.attempt} ended {decision.outcome}"
              + (f" ({decision.signal})" if decision.signal else "") + (f" at step {step}" if step is not None else "")
              + (f": {decision.error}" if decision.error else ""), flush=True)
        _remove_pid_file(self.paths, self.start.rank)
        if decision.requeue:
            # Every rank leaves through SystemExit: a rank that returned would write a success result
            # for an attempt that is being relaunched.
            raise SystemExit(LOCAL_REQUEUE_EXIT_CODE if self.start.executor == "local" else 0)
        if self.start.executor == "slurm" and decision.signal in TERMINATING_SIGNALS:
            # A job that exits during a preemption's grace time is not requeued; one that SLURM kills
            # is (PreemptMode=REQUEUE), and a scancel'ed one stays cancelled. So wait to be ended.
            print("elfes: `last` is saved; waiting for SLURM to end the job", flush=True)
            while True:
                time.sleep(60)
        return {"outcome": decision.outcome, "attempt": self.attempt, "step": step}


def _load_spec(paths: RunPaths) -> Any:
    """The spec as submitted (``RUN_DIR/job.yaml``, every path absolute)."""
    from .spec import load_spec

    return load_spec(paths.spec, check_files=False)


def _resubmit_local(paths: RunPaths) -> None:
    """Past submitit's local start limit, submit the run again (a "requeue" submission, which the
    next start counts as a requeue) into the same run directory. Rank 0, after recording "requeued"."""
    from .actions import resubmit_requeued

    job_id = resubmit_requeued(paths.run_dir)  # a detached controller; our rank variables are dropped
    print(f"elfes: submitit's local controller starts a job at most {LOCAL_MAX_STARTS} times; "
          f"resubmitted the run as local job {job_id}", flush=True)
