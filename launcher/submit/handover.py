"""What makes a hand-over to an executor one transaction: a refusal undoes every change to the run
directory (:class:`RunDirUndo`), Ctrl-C and SIGTERM wait until the hand-over is recorded
(:func:`signals_deferred`), and a hand-over that a SIGKILL cut short is found again by the next one
(:func:`interrupted_handover`).

The hand-over is written ahead: ``state.json`` says "submitted" (with the submitter's host and pid)
before the executor is asked, and gets the job id once it answered. A "submitted" run found under
the submission lock was therefore interrupted between the two: its job (a local controller of the run
directory in /proc, a SLURM job whose output goes to its submitit folder: for a sweep member, its task
of an array the sweep has not recorded, in the sweep's folder) is adopted; while a process of it may
still be handing the run over, the new submission is refused; when nothing of it is left, it is
recorded as abandoned. A SLURM job killed before submitit named its pickle after it could never run
its task: it is cancelled, and the run is handed over anew. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from elfes.files import exclusive_lock

from ..backends import backend_for
from ..errors import EXIT_INTERRUPTED, ElfesError
from ..rundir import state as run_state
from ..rundir.liveness import local_processes
from ..rundir.paths import RunPaths, SweepPaths
from ..slurm import SlurmError, cancel, user_jobs

DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A submitter on another login node gets this long to record its job (sbatch gives up well before).
REMOTE_SUBMITTER_GRACE_S = 600.0


class Interrupted(ElfesError):
    """A stop signal arrived during a hand-over; it was completed (or undone) first. ``signum`` is the signal;
    the command exits 128 + its number."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, signum: int, outcome: str) -> None:
        self.signum = signum
        self.exit_code = 128 + signum  # type: ignore[misc]  # per instance: the signal decides the code
        self.outcome = outcome
        super().__init__(f"interrupted by {signal.Signals(signum).name}; {outcome}")


@contextmanager
def signals_deferred() -> Iterator[list[int]]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends; yields the list of those that arrived.
    A no-op off the main thread (signal handlers can only be set there)."""
    arrived: list[int] = []
    try:
        previous = {signum: signal.signal(signum, lambda signum, frame: arrived.append(signum))
                    for signum in DEFERRED_SIGNALS}
    except ValueError:  # not the main thread
        yield arrived
        return
    try:
        yield arrived
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class RunDirUndo:
    """What a submission may change in a run directory, taken before it writes: :meth:`restore` undoes
    what this submission wrote and nothing that another process wrote meanwhile (a job it did not start
    records its attempts in ``state.json``; ``elfes cancel`` leaves its marker; another submission may
    have created the folder). The recorded spec and ``code.json`` are put back byte for byte, with
    ``state.json``, when its latest submission is still this process's own (a code snapshot it took is
    then removed); the cancel marker always; a folder this submission created is removed only when
    what it holds is this submission's alone. The executors
    undo their own files in submitit's folder (launcher/submit/executors.py)."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths
        self.created: list[Path] = []
        folder = paths.run_dir
        while not folder.exists():
            self.created.append(folder)
            folder = folder.parent
        self.files: dict[Path, bytes | None] = {}
        self.snapshots: list[Path] = []  # code snapshot folders this submission took (launcher/submit/snapshot.py)
        self.take()

    def take(self) -> None:
        """Read what may be restored; again once the submission holds the run's submission lock, since
        another submission may have written while this one waited for it."""
        locks = (self.paths.submit_lock, self.paths.state_lock)  # as before this submission created them
        self.files = {path: path.read_bytes() if path.is_file() else None
                      for path in (self.paths.spec, self.paths.state, self.paths.cancel_marker,
                                   self.paths.code_record)} | {
                      lock: self.files[lock] if lock in self.files else (lock.read_bytes() if lock.is_file() else None)
                      for lock in locks}

    def _state_is_ours(self) -> bool:
        """Whether ``state.json`` holds nothing since this process's own record of its submission."""
        try:
            state = run_state.load_state(self.paths)
        except run_state.RunDamaged:
            return False
        if state is None:
            return True
        latest = state.submissions[-1] if state.submissions else None
        return (latest is not None and latest.pid == os.getpid() and latest.host in (None, socket.gethostname())
                and state.status == run_state.RunStatus.SUBMITTED)

    def restore(self) -> None:
        from elfes.files import write_bytes_atomically

        ours = self._state_is_ours()
        if self.created and ours:  # the run directory is new and only this submission wrote in it
            shutil.rmtree(self.created[0], ignore_errors=True)
            for folder in self.created[1:]:
                try:
                    folder.rmdir()
                except OSError:
                    break
            return
        marker = self.paths.cancel_marker
        for lock in (self.paths.submit_lock, self.paths.state_lock):  # a run directory that had none keeps none
            if self.files[lock] is None:
                lock.unlink(missing_ok=True)
        if ours:
            for folder in self.snapshots:
                shutil.rmtree(folder, ignore_errors=True)
                with contextlib.suppress(OSError):
                    folder.parent.rmdir()  # the snapshots' folder, when this one was its only snapshot
            for path in (self.paths.spec, self.paths.state, self.paths.code_record):
                content = self.files[path]
                if content is None:
                    path.unlink(missing_ok=True)
                elif not path.is_file() or path.read_bytes() != content:
                    write_bytes_atomically(path, content)
        removed = self.files[marker]
        if removed is not None and not marker.exists():  # this submission removed it
            write_bytes_atomically(marker, removed)


# -- an interrupted hand-over ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    """What is left of an interrupted hand-over: its job (``job_id``), or a reason to wait (``busy``)."""

    job_id: str | None = None
    busy: str | None = None


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _processes_naming(folder: Path) -> list[int]:
    """Live processes on this host whose command line names a file in ``folder`` (sbatch of its script)."""
    prefix = os.path.realpath(folder) + os.sep
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            arguments = entry.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(argument.startswith(b"/") and os.path.realpath(argument.decode(errors="replace")).startswith(prefix)
               for argument in arguments):
            found.append(int(entry.name))
    return found


def _output_folder(paths: RunPaths, submission: run_state.Submission) -> Path:
    """Where the job of ``submission`` writes its output: the run's submitit folder, or for a sweep member
    handed over in a job array, the sweep's."""
    return Path(submission.submitit_folder) if submission.submitit_folder else paths.submitit


def _recorded_arrays(folder: Path) -> set[str]:
    """The job arrays a sweep recorded (``sweep.json`` beside its submitit ``folder``): they belong to
    hand-overs that completed, so none of them is the job of an interrupted one."""
    from ..rundir.sweep_record import load_sweep

    try:
        return {job.job_id for job in load_sweep(SweepPaths(folder.parent)).jobs}
    except run_state.RunDamaged:
        return set()


def _slurm_jobs_of(paths: RunPaths, submission: run_state.Submission) -> list[str] | None:
    """Queued or running SLURM jobs of this user whose standard output goes to the submission's folder
    (for an array member, its task of an array the sweep has not recorded); None where squeue does not answer."""
    try:
        queued = user_jobs(with_output=True)
    except SlurmError:
        return None
    folder = os.path.realpath(_output_folder(paths, submission))
    in_array = submission.submitit_folder is not None
    recorded = _recorded_arrays(Path(folder)) if in_array else set()
    jobs = []
    for job in queued:
        if not job.output or os.path.realpath(os.path.dirname(job.output)) != folder:
            continue
        job_id = job.job_id
        if in_array:
            base = job.base_id
            wanted = str(submission.array_task) if submission.array_task is not None else None
            if base in recorded or (wanted is not None and job.array_task_id != wanted):
                continue
            job_id = job.name if submission.array_task is not None else base
        jobs.append(job_id)
    return jobs


def interrupted_handover(paths: RunPaths, state: run_state.RunState) -> Found:
    """For a run left "submitted" (the submitter was killed between asking the executor and recording
    the answer): the job it started, or why it may still be starting one; ``Found()`` when nothing is left."""
    submission = state.submissions[-1] if state.submissions else None
    if submission is None:
        return Found()
    here = submission.host in (None, socket.gethostname())
    if here and submission.pid is not None and submission.pid != os.getpid() and _process_alive(submission.pid):
        return Found(busy=f"the submitter (pid {submission.pid}) is still running")
    if backend_for(state.executor).runs_here:
        processes = local_processes(paths)
        if processes["controller"]:
            return Found(job_id=str(min(processes["controller"])))
        if processes["task"]:
            return Found(busy=f"tasks of the run are alive without their controller (pids {processes['task']})")
    else:
        known = {item.job_id for item in state.submissions if item.job_id}
        jobs = _slurm_jobs_of(paths, submission)
        if jobs is None:
            return Found(busy="squeue does not answer, so a job it may have queued cannot be ruled out")
        new = [job for job in jobs if job not in known]
        if new:
            job_id = new[-1]
            if (_output_folder(paths, submission) / f"{job_id}_submitted.pkl").is_file():
                return Found(job_id=job_id)
            # Killed before submitit named the job's pickle after it: the job can never run its task
            # (submitit waits 60 s for the pickle, then fails). Cancelled here, it cannot start either.
            cancelled = cancel(job_id)
            if not cancelled.ok:
                said = cancelled.stderr.strip() if cancelled.started else "no answer"
                return Found(busy=f"its SLURM job {job_id} has no task to run and could not be cancelled "
                                  f"(`scancel {job_id}`: {said})")
    in_flight = _processes_naming(_output_folder(paths, submission))
    if in_flight:
        return Found(busy=f"processes of it are still running (pids {in_flight}; sbatch?)")
    if not here and _age_s(submission.at) < REMOTE_SUBMITTER_GRACE_S:
        return Found(busy=f"it runs on {submission.host} (pid {submission.pid}), which this host cannot look into")
    return Found()


def _age_s(at: str) -> float:
    try:
        return (datetime.now(timezone.utc) - datetime.fromisoformat(at)).total_seconds()
    except ValueError:
        return float("inf")


def submission_lock(paths: RunPaths) -> AbstractContextManager[None]:
    """Held while a submission writes the run directory (``RunPaths.submit_lock``)."""
    return exclusive_lock(paths.submit_lock)


def reserve_room_for_record_job(paths: RunPaths) -> Path:
    """Before the hand-over: take the room recording its job needs (launcher/submit/transaction.py), in the
    very temporary file its write of ``state.json`` reuses, so that a full disk refuses the submission while it
    can still be undone (once the executor took the job, a state.json left "submitted" would name no job). The
    caller removes the file when the hand-over fails."""
    from elfes.files import temporary_name

    reserved = temporary_name(paths.state)
    size = (paths.state.stat().st_size if paths.state.is_file() else 0) + 1024  # the job id and a margin
    try:
        with open(reserved, "wb") as file:
            file.write(b" " * size)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:  # the disk is full already: refused, and nothing of this submission is left
        reserved.unlink(missing_ok=True)
        raise
    return reserved
