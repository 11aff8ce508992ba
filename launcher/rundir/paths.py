"""The layout of a run directory: the one owner of every file name in it.

Every process that reads or writes a run directory (the submitter, the job's ranks, ``elfes status``)
builds a :class:`RunPaths` and asks it for names; no other module spells a file name of the run
directory. The names the engine writes (events, timings, trackers, TensorBoard) are elfes.contract's, which the
engine builds its own paths from. Like submitit's ``JobPaths``, it is a pure value: building one touches nothing on disk.

```
RUN_DIR/
  job.yaml                      the spec as submitted (every path resolved, absolute)
  state.json                    the run's state (launcher/rundir/state.py), written atomically
  events.jsonl                  the engine's run records (elfes.records)
  timings.json                  their running totals of each attempt's phase times (elfes.records.timings), for the goodput
  checkpoints/                  last, best, final and the step files (elfes.engine.checkpoint)
  logs/attempt-<A>/rank-<R>.out the standard output of one rank in one attempt
  logs/attempt-<A>/rank-<R>.err its standard error
  logs/attempt-<A>/rank-<R>.failure.json  why rank R failed in attempt A (launcher/job/failures.py)
  pids/rank-<R>.json            the live task of rank R (pid, host, attempt), once its handlers are in
  submitit/                     submitit's folder: pickles, results, its own per-task logs
  submitit/<J>_<T>_log.out|err  submitit's own log of task T of job J (before the runtime redirects)
  submitit/controller.log       a local job's controller output (detached from the submitter)
  cancel-requested              marker left by `elfes cancel` before it signals the job
  .submit.lock                  held while a submission or resume writes the run directory
  .state.lock                   held while state.json is read, changed and rewritten (launcher/rundir/state.py)
  code.json                     the code snapshot every attempt runs (launcher/rundir/code_record.py); none with
                                `snapshot: false`
  code/<N>/                     that snapshot: a copy of the spec's workdir taken at submission (launcher/submit/snapshot.py)
  pids/rank-<R>.starts          starts of rank R in the current local job (submitit sets no restart count)
  pids/master-port.json         the job's rendezvous port, chosen free by rank 0 for this start
  pids/command-<R>.json         the process group of rank R's `command:` while it runs (pgid, host, notice)
  pids/exit-<R>.json            how the task of rank R ended (its exit status), as a local job's controller saw it
  tracking/<tracker>.json       what the MLflow or W&B mirror has sent (elfes.records.tracker_mirror), written atomically
  tracking/lifecycle.json       what the trackers are to say of the run: status, attempts' ends, spec, provenance
                                (elfes.records.tracker_lifecycle), written atomically by rank 0
  tracking/<tracker>.lock       held by whoever sends to that tracker: the attempt's mirror, or `elfes sync`
  tracking/wandb/               the W&B SDK's folder (offline runs for `wandb sync`)
```

>>> paths = RunPaths("runs/quickstart")
>>> paths.state
PosixPath('runs/quickstart/state.json')
>>> paths.rank_log(attempt=2, rank=1, stream="err")
PosixPath('runs/quickstart/logs/attempt-2/rank-1.err')
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from elfes.contract import (
    EVENTS_FILE_NAME,
    TENSORBOARD_DIR_NAME,
    TIMINGS_FILE_NAME,
    TRACKING_DIR_NAME,
    Pointer,
    tracker_state_file_name,
)

Stream = Literal["out", "err"]


@dataclass(frozen=True)
class RunPaths:
    """File names of one run directory. Any process; nothing is created or read."""

    run_dir: Path

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "run_dir", Path(run_dir))

    @classmethod
    def of_submitit_folder(cls, folder: str | os.PathLike[str]) -> RunPaths:
        """The run directory whose :attr:`submitit` folder is ``folder`` (what a local job's controller is given)."""
        folder = Path(folder)
        if folder.name != "submitit":
            raise ValueError(f"{folder} is not a run directory's submitit folder (RUN_DIR/submitit)")
        return cls(folder.parent)

    # -- what the submitter records --------------------------------------------------------------
    @property
    def spec(self) -> Path:
        """The job spec as submitted (YAML, paths absolute); a later submission is compared with it."""
        return self.run_dir / "job.yaml"

    @property
    def state(self) -> Path:
        """``state.json``: the run's state machine and attempts (format owned by launcher/rundir/state.py)."""
        return self.run_dir / "state.json"

    @property
    def submit_lock(self) -> Path:
        """Held (``fcntl.flock``) while ``submit``/``resume`` write the run directory."""
        return self.run_dir / ".submit.lock"

    @property
    def state_lock(self) -> Path:
        """Held (``fcntl.flock``) while ``state.json`` is read, changed and rewritten."""
        return self.run_dir / ".state.lock"

    @property
    def code_record(self) -> Path:
        """``code.json``: where the job's code snapshot lives and what it was taken from (written atomically by
        ``submit``/``resume``; read by every attempt). Absent when the spec says ``snapshot: false``."""
        return self.run_dir / "code.json"

    @property
    def code(self) -> Path:
        """The folder of the run's code snapshots, one ``code/<N>/`` per snapshot taken (older ones pruned)."""
        return self.run_dir / "code"

    @property
    def cancel_marker(self) -> Path:
        """Left by ``elfes cancel`` before it signals the job, so the attempt ends ``cancelled``."""
        return self.run_dir / "cancel-requested"

    # -- what the job writes ---------------------------------------------------------------------
    @property
    def events(self) -> Path:
        """The engine's run records (``elfes.contract.EVENTS_FILE_NAME``)."""
        return self.run_dir / EVENTS_FILE_NAME

    @property
    def timings(self) -> Path:
        """The running totals of the run records' phase times (``elfes.contract.TIMINGS_FILE_NAME``), written
        atomically by the RunLogger beside :attr:`events`; ``elfes status`` reads the goodput from it."""
        return self.run_dir / TIMINGS_FILE_NAME

    @property
    def checkpoints(self) -> Path:
        """The trainer's ``checkpoint_dir``."""
        return self.run_dir / "checkpoints"

    @property
    def last(self) -> Path:
        """The ``last`` pointer (a symlink inside :attr:`checkpoints`); a resume starts from it."""
        return self.checkpoints / Pointer.LAST

    @property
    def best(self) -> Path:
        return self.checkpoints / Pointer.BEST

    @property
    def final(self) -> Path:
        return self.checkpoints / Pointer.FINAL

    @property
    def tracking(self) -> Path:
        """The experiment trackers' mirror (the spec's ``tracking:``; ``elfes.contract.TRACKING_DIR_NAME``):
        ``<tracker>.json``, each mirror's state, and ``wandb/``, the W&B SDK's folder."""
        return self.run_dir / TRACKING_DIR_NAME

    def tracker_state(self, tracker: str) -> Path:
        """What the ``tracker`` mirror has sent and whether it is behind (``elfes status`` reads it)."""
        return self.tracking / tracker_state_file_name(tracker)
    @property
    def tensorboard(self) -> Path:
        """The engine's TensorBoard mirror (``RunLogger(tensorboard=True)`` or ``ELFES_TENSORBOARD=1``;
        ``elfes.contract.TENSORBOARD_DIR_NAME``): ``tensorboard --logdir`` it."""
        return self.run_dir / TENSORBOARD_DIR_NAME

    @property
    def plot(self) -> Path:
        """Where ``elfes plot RUN_DIR`` draws when no ``-o`` names another file."""
        return self.run_dir / "plot.png"

    @property
    def logs(self) -> Path:
        """Per-attempt, per-rank standard streams of the job."""
        return self.run_dir / "logs"

    def attempt_logs(self, attempt: int) -> Path:
        """The log folder of one attempt (attempts count from 1)."""
        return self.logs / f"attempt-{int(attempt)}"

    def rank_log(self, attempt: int, rank: int, stream: Stream = "out") -> Path:
        """The stdout (``"out"``) or stderr (``"err"``) file of ``rank`` in ``attempt``."""
        if stream not in ("out", "err"):
            raise ValueError(f"stream must be 'out' or 'err', got {stream!r}")
        return self.attempt_logs(attempt) / f"rank-{int(rank)}.{stream}"

    def failure_report(self, attempt: int, rank: int) -> Path:
        """JSON: why ``rank`` failed in ``attempt`` (its error, step, time), written atomically when it failed
        or its hang watchdog fired; the other ranks read it (format owned by launcher/job/failures.py)."""
        return self.attempt_logs(attempt) / f"rank-{int(rank)}.failure.json"

    @property
    def pids(self) -> Path:
        """One file per live task, written by the runtime once its signal handlers are installed."""
        return self.run_dir / "pids"

    def pid_file(self, rank: int) -> Path:
        """JSON ``{"pid", "host", "attempt", "rank"}`` of the task of ``rank`` (replaced each attempt)."""
        return self.pids / f"rank-{int(rank)}.json"

    @property
    def master_port(self) -> Path:
        """JSON ``{"start", "port"}``: the free port rank 0 chose for torch's rendezvous in
        that start (its token); the other ranks read it (written atomically, replaced each start)."""
        return self.pids / "master-port.json"

    def start_count(self, rank: int) -> Path:
        """JSON ``{"job", "starts"}``: how often rank R started in that local job ("<job id>/<submission>";
        the runtime's own restart count, as submitit's local controller sets none)."""
        return self.pids / f"rank-{int(rank)}.starts"

    def command_group(self, rank: int) -> Path:
        """JSON ``{"pgid", "host", "task_pid", "attempt", "rank", "notice"}``: the process group of the
        ``command:`` that the task of ``rank`` runs, from its start until every member is reaped."""
        return self.pids / f"command-{int(rank)}.json"

    def task_exit(self, rank: int) -> Path:
        """JSON ``{"job", "rank", "pid", "returncode", "at"}``: how the latest task of ``rank`` ended, written
        atomically by a local job's controller the moment it sees the exit (launcher/submit/local_controller.py;
        format owned by launcher/rundir/task_files.py). SLURM jobs have none: srun, not ELFES, is the tasks' parent."""
        return self.pids / f"exit-{int(rank)}.json"

    # -- the executor's own files ----------------------------------------------------------------
    @property
    def submitit(self) -> Path:
        """submitit's folder (its pickles, result files and ``%j_%t_log.out``/``.err``)."""
        return self.run_dir / "submitit"

    def submitit_log(self, job_id: str, task: int, stream: Stream = "out") -> Path:
        """submitit's own log of task ``task`` of job ``job_id`` (its ``%j_%t_log.out|err``): what the task
        printed before its streams went to the attempt's logs, or where those could not take it."""
        if stream not in ("out", "err"):
            raise ValueError(f"stream must be 'out' or 'err', got {stream!r}")
        return self.submitit / f"{job_id}_{int(task)}_log.{stream}"

    @property
    def controller_log(self) -> Path:
        """Standard output and error of a local job's controller, detached from the submitter."""
        return self.submitit / "controller.log"


@dataclass(frozen=True)
class SweepPaths:
    """File names of a sweep's folder (the spec's ``run_dir`` when it has a ``sweep``): one run directory
    per member, named from its overrides, beside the sweep's own files. Nothing is created or read.

    ```
    SWEEP_DIR/
      sweep.json          the members (name, run directory, overrides), the jobs, the local queue
      code/<N>/           the code snapshot every member runs (each member's code.json names it)
      <member>/           a complete run directory (RunPaths), e.g. lr=0.001,seed=0/
      submitit/           submitit's folder of the SLURM job array(s)
      scheduler.log       the local sweep scheduler's output
      .sweep.lock         held while sweep.json is read, changed and rewritten
      .scheduler.lock     held by the live local scheduler for its whole life
    ```
    """

    sweep_dir: Path

    def __init__(self, sweep_dir: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "sweep_dir", Path(sweep_dir))

    @property
    def record(self) -> Path:
        """``sweep.json`` (format owned by launcher/rundir/sweep_record.py), written atomically."""
        return self.sweep_dir / "sweep.json"

    @property
    def lock(self) -> Path:
        return self.sweep_dir / ".sweep.lock"

    @property
    def scheduler_lock(self) -> Path:
        """Held (``fcntl.flock``) by the local scheduler while it lives: free means none is running."""
        return self.sweep_dir / ".scheduler.lock"

    @property
    def scheduler_log(self) -> Path:
        return self.sweep_dir / "scheduler.log"

    @property
    def code(self) -> Path:
        """The folder of the sweep's code snapshots (``code/<N>/``), taken once per sweep submission."""
        return self.sweep_dir / "code"

    @property
    def submitit(self) -> Path:
        """submitit's folder for the sweep's SLURM job arrays (pickles and per-task logs)."""
        return self.sweep_dir / "submitit"

    @property
    def plot(self) -> Path:
        """Where ``elfes plot SWEEP_DIR`` draws when no ``-o`` names another file."""
        return self.sweep_dir / "plot.png"

    def member(self, name: str) -> RunPaths:
        """The run directory of the member ``name``."""
        return RunPaths(self.sweep_dir / name)
