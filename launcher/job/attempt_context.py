"""What one task knows of its attempt from the start, computed once and frozen: :class:`AttemptContext`.

Every rank derives the attempt's number, its launch and the requeues and failures used from the same
``state.json`` content, whether or not rank 0 has recorded this start yet, so every rank numbers and
judges the attempt alike. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backends import Executor
from ..rundir import state as run_state
from ..rundir.code_record import job_spec
from ..rundir.paths import RunPaths
from ..spec import JobSpec
from ..submit.scripts import requeue_signal
from .distributed_env import Start, detect_start


@dataclass(frozen=True)
class AttemptContext:
    """One task's part of one attempt (start) of the job, as it stands when the task begins."""

    paths: RunPaths
    start: Start  # who and where this task is: executor, job id, restart, rank, world size, hosts
    token: str  # this start's name in state.json (Start.token)
    attempt_number: int  # starts of this run, from 1, counting on across requeues and `elfes resume`
    launch: str  # how this start came about: "submit", "resume" or "requeue"
    requeues_used: int  # this start's own launch included, if it was a requeue
    failures_used: int  # retried failures before this start since the run was last handed over by hand
    previous: run_state.Attempt | None  # the attempt before this one
    state_at_start: run_state.RunState | None  # state.json as read at the start (the cancel marker's reference)
    requeue_signal_name: str  # submitit's requeue signal (SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise)
    started_at: str
    # The spec as the job sees it (workdir: the run's code snapshot, when it has one), and the workdir it was
    # submitted with (the working tree the snapshot copies); None, with why, where RUN_DIR/job.yaml could not
    # be read: the attempt then fails like any attempt whose code raises (AttemptContext.job_spec).
    spec: JobSpec | None
    recorded_workdir: str | None
    spec_error: Exception | None

    @classmethod
    def read(cls, paths: RunPaths) -> AttemptContext:
        """This task's context: ``state.json`` and ``job.yaml`` read once, the start detected. Every rank, first."""
        before = run_state.load_state(paths)
        submissions = len(before.submissions) if before is not None else 0
        start = detect_start(paths, submissions)
        token = start.token(submissions)
        launch = run_state.Launch.REQUEUE if start.restart > 0 else run_state.latest_submission_kind(before)
        spec, recorded_workdir, spec_error = None, None, None
        try:
            recorded = _load_spec(paths)
            recorded_workdir = str(recorded.workdir)
            spec = job_spec(recorded, paths)
        except Exception as error:
            spec_error = error
        return cls(
            paths=paths, start=start, token=token, attempt_number=run_state.attempt_number(before, token),
            launch=launch, requeues_used=run_state.requeues_used_by(before, token, launch),
            failures_used=run_state.failures_used_by(before, token, launch),
            previous=run_state.previous_attempt(before, token), state_at_start=before,
            requeue_signal_name=requeue_signal().name, started_at=run_state.now(),
            spec=spec, recorded_workdir=recorded_workdir, spec_error=spec_error)

    @property
    def is_main(self) -> bool:
        return self.start.rank == 0

    @property
    def executor(self) -> Executor:
        return self.start.executor

    @property
    def max_requeues(self) -> int:
        return self.spec.requeue.max_requeues if self.spec is not None else 0

    @property
    def max_failures(self) -> int:
        """The spec's ``requeue.max_failures``; 0 without a spec: a failure to read it is not retried."""
        return self.spec.requeue.max_failures if self.spec is not None else 0

    def job_spec(self) -> JobSpec:
        """The spec, or the error that kept it from being read (raised where the attempt handles failures)."""
        if self.spec is None:
            raise self.spec_error if self.spec_error is not None else RuntimeError(f"{self.paths.spec} was not read")
        return self.spec

    def pid_record(self) -> dict[str, Any]:
        """What this task's pid file says of it (``elfes preempt`` signals the task it names)."""
        return {"host": self.start.host, "attempt": self.attempt_number, "rank": self.start.rank,
                "job_id": self.start.job_id, "executor": self.start.executor}

    def begin(self, state: run_state.RunState | None) -> run_state.RunState:
        """``state`` with this attempt begun (a no-op once it is: recording the same token again changes nothing)."""
        if state is None:
            raise run_state.RunDamaged("state.json is missing")
        return run_state.begin_attempt(state, token=self.token, job_id=self.start.job_id, launch=self.launch,
                                       hosts=self.start.hosts, world_size=self.start.world_size)


def _load_spec(paths: RunPaths) -> Any:
    """The spec as submitted (``RUN_DIR/job.yaml``, every path absolute)."""
    from ..spec import load_spec

    return load_spec(paths.spec, check_files=False)

