"""One function per verb of the ``elfes`` command, returning data; printing is the CLI's job.

Torch-free: everything here runs on a login node. The verbs that change a run (``submit``,
``resume``, ``cancel``) record what they do in ``state.json`` through launcher/state.py; ``status``
and ``logs`` only read files (and ask SLURM's ``squeue``/``sacct`` where they exist).

Errors: :class:`~launcher.spec.SpecError`, :class:`~launcher.executors.ExecutorError` and
:class:`UsageError` are bad input (nothing was created); :class:`ActionFailed`,
:class:`~launcher.executors.SubmissionError` and :class:`~launcher.state.StateError` mean the verb
cannot be carried out now.

>>> result = submit("examples/quickstart/job.yaml", executor="local")
>>> status([result.run_dir])[0].status
'pending'
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from elfes.files import write_text_atomically

from . import executors
from . import state as run_state
from .paths import RunPaths
from .spec import JobSpec, SpecError, json_schema, load_spec

TEMPLATES_PACKAGE = "elfes.launcher.templates"
# squeue states in which a SLURM job is still queued or alive.
_SLURM_ALIVE = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
    "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
})


class UsageError(ValueError):
    """Bad input that is not a spec field: an unknown run directory, a template, a file in the way."""


class ActionFailed(RuntimeError):
    """The verb cannot be carried out now (no live task to signal, SLURM command failed, ...)."""


# -- validate, schema, init ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Validated:
    spec: JobSpec
    source: Path
    executor: str  # what `auto` would choose here


def validate(spec_file: str | os.PathLike[str], *, executor: str = "auto") -> Validated:
    """Check a spec file (and that ``executor`` can run it). Creates nothing."""
    spec = load_spec(spec_file)
    chosen = executors.choose_executor(executor)
    executors.check_executor(spec, chosen)
    return Validated(spec=spec, source=Path(spec_file), executor=chosen)


def schema() -> dict[str, Any]:
    """The JSON Schema of the job spec."""
    return json_schema()


def template_names() -> list[str]:
    """The templates ``elfes init`` can write (file stems of ``templates/*.yaml``)."""
    folder = resources.files(TEMPLATES_PACKAGE)
    return sorted(entry.name[: -len(".yaml")] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def template_text(name: str) -> str:
    names = template_names()
    if name not in names:
        raise UsageError(f"template {name!r} does not exist; choose one of: {', '.join(names)}")
    return resources.files(TEMPLATES_PACKAGE).joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def init(template: str = "local-debug", path: str | os.PathLike[str] = "job.yaml") -> Path:
    """Write template ``template`` to ``path`` (refusing to overwrite a file); returns ``path``."""
    text = template_text(template)
    target = Path(path)
    if target.exists():
        raise UsageError(f"{target} already exists; give another path (elfes init {template} PATH) or remove it")
    if not target.parent.is_dir():
        raise UsageError(f"{target.parent} is not a folder; create it first or give another path")
    with open(target, "x", encoding="utf-8") as stream:
        stream.write(text)
    return target


# -- liveness ---------------------------------------------------------------------------------------------------
def _proc_cmdline(pid: int) -> list[str] | None:
    """The command line of a live (non-zombie) process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2:].startswith(("Z", "X")):
            return None
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _same_folder(argument: str, folder: Path) -> bool:
    return os.path.realpath(argument) == os.path.realpath(folder)


def _is_process_of(cmdline: list[str] | None, paths: RunPaths, module: str) -> bool:
    """Whether a command line is ``python ... -m <module> <RUN_DIR/submitit>`` of this run."""
    return bool(cmdline) and module in cmdline and _same_folder(cmdline[-1], paths.submitit)


def local_processes(paths: RunPaths) -> dict[str, list[int]]:
    """Live processes of this run's local job on this machine: ``{"controller": [...], "task": [...]}``."""
    found: dict[str, list[int]] = {"controller": [], "task": []}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        cmdline = _proc_cmdline(int(entry.name))
        if _is_process_of(cmdline, paths, "submitit.local._local"):
            found["controller"].append(int(entry.name))
        elif _is_process_of(cmdline, paths, "submitit.core._submit"):
            found["task"].append(int(entry.name))
    return found


def _run_command(argv: list[str]) -> subprocess.CompletedProcess | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def slurm_queue_state(job_id: str) -> str | None:
    """SLURM's state of ``job_id`` (``squeue``, else ``sacct``), or None where neither answers."""
    queued = _run_command(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if queued is not None and queued.returncode == 0 and queued.stdout.strip():
        return queued.stdout.split()[0]
    accounted = _run_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])
    if accounted is not None and accounted.returncode == 0 and accounted.stdout.strip():
        return accounted.stdout.splitlines()[-1].split()[0]
    if queued is not None and (queued.returncode == 0 or "Invalid job id" in queued.stderr):
        return "GONE"  # squeue answered and no longer knows the job
    return None


@dataclass(frozen=True)
class Liveness:
    alive: bool | None  # None: cannot tell from here
    queue_state: str | None  # SLURM's state, "RUNNING"/"GONE" for a local job, None when unknown


def liveness(paths: RunPaths, state: run_state.RunState | None) -> Liveness:
    """Whether the run's job is still queued or alive, as far as this machine can tell."""
    if state is None or state.job_id is None:
        return Liveness(None, None)
    if state.executor == "local":
        processes = local_processes(paths)
        alive = bool(processes["controller"] or processes["task"])
        if state.status in run_state.ENDED:
            return Liveness(alive, "EXITING" if alive else None)
        return Liveness(alive, "RUNNING" if alive else "GONE")
    queue = slurm_queue_state(state.job_id)
    if queue is None:
        return Liveness(None, None)
    return Liveness(queue in _SLURM_ALIVE, queue)


class LivenessProbe:
    """:func:`liveness` for a polling loop, asking SLURM at most every ``slurm_every_s`` (squeue loads
    the cluster's controller) and /proc at most every ``local_every_s``."""

    def __init__(self, paths: RunPaths, *, slurm_every_s: float = 30.0, local_every_s: float = 1.0) -> None:
        self.paths = paths
        self.every_s = {"slurm": slurm_every_s, "local": local_every_s}
        self._last: tuple[float, str | None, Liveness] | None = None

    def __call__(self, state: run_state.RunState | None) -> Liveness:
        now = time.monotonic()
        key = None if state is None else f"{state.executor}:{state.job_id}:{state.status in run_state.ENDED}"
        if self._last is not None:
            at, last_key, live = self._last
            every = self.every_s.get(state.executor if state is not None else "", 0.0)
            if last_key == key and now - at < every:
                return live
        live = liveness(self.paths, state)
        self._last = (now, key, live)
        return live


def cancel_requested(paths: RunPaths, state: run_state.RunState | None) -> bool:
    """Whether ``elfes cancel`` left its marker for the current submission (the rule the runtime uses)."""
    try:
        marked = paths.cancel_marker.stat().st_mtime
    except FileNotFoundError:
        return False
    if state is None or not state.submissions:
        return True
    return marked >= datetime.fromisoformat(state.submissions[-1].at).timestamp()


def effective_state(paths: RunPaths, state: run_state.RunState | None, live: Liveness) -> run_state.RunState | None:
    """``state`` as it is once a job that is gone without recording its end is counted lost (pure)."""
    if state is None or state.status in run_state.ENDED or state.status == "submitted" or live.alive is not False:
        return state
    return run_state.mark_lost(state, cancelled=cancel_requested(paths, state))


# -- the run directory -----------------------------------------------------------------------------------------
def run_paths(run_dir: str | os.PathLike[str]) -> RunPaths:
    """The paths of an existing run directory, or UsageError saying what the folder is not."""
    paths = RunPaths(Path(os.path.abspath(run_dir)))
    if not paths.run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory; give the run_dir of a submitted job "
                         "(its job.yaml names it)")
    if not paths.spec.is_file() and not paths.state.is_file():
        raise UsageError(f"{run_dir}: not a run directory (no {paths.spec.name} or {paths.state.name}); give the "
                         "run_dir of a job submitted with `elfes submit`")
    return paths


@contextmanager
def _submission_lock(paths: RunPaths) -> Iterator[None]:
    descriptor = os.open(paths.submit_lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _recorded_spec(paths: RunPaths) -> JobSpec | None:
    if not paths.spec.is_file():
        return None
    return load_spec(paths.spec, check_files=False)


def _refuse_different_spec(spec: JobSpec, source: Path, paths: RunPaths) -> bool:
    """True when ``paths`` already records this same spec; UsageError naming the fields when it records another."""
    try:
        recorded = _recorded_spec(paths)
    except SpecError as error:
        raise UsageError(f"{paths.spec} (the spec recorded in the run directory) cannot be read: {error}") from None
    if recorded is None:
        return False
    differing = recorded.differences(spec)
    if differing:
        raise UsageError(
            f"{source}: run directory {paths.run_dir} holds a different job (fields that differ: "
            f"{', '.join(differing)}); submit the same spec to continue that run from `last`, or give this job "
            "another run_dir"
        )
    return True


def _close_lost_job(paths: RunPaths) -> run_state.RunState | None:
    """Record a job that is gone without an outcome as lost (submitter side, before a new submission)."""
    state = run_state.load_state(paths)
    live = liveness(paths, state)
    if effective_state(paths, state, live) is state:
        return state
    return run_state.update_state(
        paths, lambda s: run_state.mark_lost(s, cancelled=cancel_requested(paths, s)) if s is not None else s
    )


def _hand_over(spec: JobSpec, paths: RunPaths, executor: str, kind: str) -> run_state.RunState:
    """Record a submission of ``kind``, submit, record the job id (or the failure)."""
    run_state.update_state(paths, lambda s: run_state.record_submission(
        s, executor=executor, kind=kind, max_requeues=spec.requeue.max_requeues))
    try:
        job_id = executors.submit(spec, paths, executor)
    except (executors.SubmissionError, executors.ExecutorError) as error:
        message = str(error)
        run_state.update_state(paths, lambda s: run_state.mark_submission_failed(s, error=message))
        raise
    return run_state.update_state(paths, lambda s: run_state.mark_pending(s, job_id=job_id))


# -- submit, resume ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Submitted:
    run_dir: Path
    name: str
    executor: str
    job_id: str | None  # None for a dry run
    status: str | None
    continued: bool  # the run directory already held this spec: the job continues from `last`
    dry_run: str | None = None  # the sbatch script or local command of a dry run


def submit(spec_file: str | os.PathLike[str], *, executor: str = "auto", dry_run: bool = False) -> Submitted:
    """Validate ``spec_file``, create its run directory, record the spec and the submission, submit.

    ``dry_run``: return the sbatch script or local command instead, touching nothing.
    Submitting again to a run directory that holds a different spec is refused (UsageError naming the
    differing fields); the same spec continues the run from ``last``.
    """
    source = Path(spec_file)
    spec = load_spec(source)
    chosen = executors.choose_executor(executor)
    executors.check_executor(spec, chosen)
    paths = RunPaths(spec.run_dir)
    if dry_run:
        continued = paths.spec.is_file() and _refuse_different_spec(spec, source, paths)
        return Submitted(paths.run_dir, spec.name, chosen, None, None, continued,
                         executors.dry_run(spec, paths, chosen))
    if paths.run_dir.is_dir():
        _refuse_different_spec(spec, source, paths)  # before anything is written there
    try:
        paths.run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecError(f"{source}: run_dir = {str(spec.run_dir)!r}: cannot be created ({error.strerror or error}); "
                        "give a folder this user can create") from None
    with _submission_lock(paths):
        continued = _refuse_different_spec(spec, source, paths)
        if not continued:
            write_text_atomically(paths.spec, spec.to_yaml())
        _close_lost_job(paths)
        paths.cancel_marker.unlink(missing_ok=True)
        state = _hand_over(spec, paths, chosen, "submit")
    return Submitted(paths.run_dir, spec.name, chosen, state.job_id, state.status, continued)


def resume(run_dir: str | os.PathLike[str]) -> Submitted:
    """Submit a stopped, cancelled or failed run again, on its executor; it continues from ``last``."""
    paths = run_paths(run_dir)
    if not paths.spec.is_file():
        raise UsageError(f"{run_dir}: no recorded spec ({paths.spec.name}); submit the job with `elfes submit`")
    with _submission_lock(paths):
        state = _close_lost_job(paths)
        if state is None:
            raise UsageError(f"{run_dir}: no state.json (the job was never submitted); use `elfes submit`")
        if state.status not in run_state.RESUMABLE:
            hint = ("nothing is left to train; raise the budget in a new spec to train further"
                    if state.status == "finished" else "wait for it to stop, or `elfes cancel` it first")
            raise run_state.StateError(f"{run_dir}: the run is {state.status}; only a stopped, cancelled or failed "
                                       f"run can be resumed ({hint})")
        spec = load_spec(paths.spec)  # the entrypoint must still be there
        executors.check_executor(spec, state.executor)
        paths.cancel_marker.unlink(missing_ok=True)
        state = _hand_over(spec, paths, state.executor, "resume")
    return Submitted(paths.run_dir, spec.name, state.executor, state.job_id, state.status, True)


def resubmit_requeued(run_dir: str | os.PathLike[str]) -> str:
    """A local job's rank 0, past submitit's six starts: submit the requeued run again (a requeue).
    Returns the new job id."""
    paths = RunPaths(Path(run_dir))
    spec = load_spec(paths.spec, check_files=False)
    with _submission_lock(paths):
        state = _hand_over(spec, paths, "local", "requeue")
    return str(state.job_id)


# -- status -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Status:
    """Where one run stands (``elfes status``); ``to_json()`` is the ``--json`` form."""

    run_dir: str
    name: str | None
    status: str  # one of launcher.state.STATUSES ("unknown" without state.json)
    executor: str | None
    job_id: str | None
    queue_state: str | None
    attempts: list[dict[str, Any]]
    requeues_used: int
    requeues_left: int | None
    max_requeues: int | None
    step: int | None
    planned_steps: int | None
    epoch: int | None
    epochs: int | None
    monitor: str | None
    best_metric: float | None
    best_step: int | None
    last_checkpoint: str | None
    last_event_time: str | None
    error: str | None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _last_checkpoint(paths: RunPaths) -> str | None:
    if not paths.last.is_symlink():
        return None
    return str(paths.checkpoints / os.readlink(paths.last))


def _summary(paths: RunPaths) -> Any:
    from elfes.records import read_events, summarize

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a line torn by a kill; the rest of the file is intact
        try:
            return summarize(read_events(paths.run_dir))
        except (FileNotFoundError, ValueError):
            return None


def run_status(run_dir: str | os.PathLike[str]) -> Status:
    """The status of one run directory. Reads files (and asks SLURM); writes nothing."""
    paths = run_paths(run_dir)
    notes: list[str] = []
    try:
        name = _recorded_spec(paths).name if paths.spec.is_file() else None
    except SpecError:
        name = None
        notes.append(f"{paths.spec} cannot be read")
    recorded = run_state.load_state(paths)
    live = liveness(paths, recorded)
    state = effective_state(paths, recorded, live)
    if state is not recorded and state is not None:
        notes.append(f"the job is gone without recording its end (was {recorded.status}); `elfes resume` continues it")
    summary = _summary(paths)
    return Status(
        run_dir=str(paths.run_dir),
        name=name,
        status=state.status if state is not None else "unknown",
        executor=state.executor if state is not None else None,
        job_id=state.job_id if state is not None else None,
        queue_state=live.queue_state,
        attempts=[asdict(attempt) for attempt in state.attempts] if state is not None else [],
        requeues_used=state.requeues_used if state is not None else 0,
        requeues_left=state.requeues_left if state is not None else None,
        max_requeues=state.max_requeues if state is not None else None,
        step=getattr(summary, "step", None),
        planned_steps=getattr(summary, "planned_steps", None),
        epoch=getattr(summary, "epoch", None),
        epochs=getattr(summary, "epochs", None),
        monitor=getattr(summary, "monitor", None),
        best_metric=getattr(summary, "best_metric", None),
        best_step=getattr(summary, "best_step", None),
        last_checkpoint=_last_checkpoint(paths),
        last_event_time=getattr(summary, "last_event_time", None),
        error=state.error if state is not None else None,
        notes=notes,
    )


def status(run_dirs: Sequence[str | os.PathLike[str]]) -> list[Status]:
    """The status of each run directory, in order."""
    return [run_status(run_dir) for run_dir in run_dirs]


# -- logs -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogFiles:
    attempt: int | None
    rank: int
    files: list[Path]  # stdout then stderr, those that exist


def _latest_attempt(paths: RunPaths, state: run_state.RunState | None) -> int | None:
    numbers = [attempt.number for attempt in state.attempts] if state is not None else []
    if paths.logs.is_dir():
        numbers += [int(p.name.split("-")[1]) for p in paths.logs.glob("attempt-*") if p.name.split("-")[1].isdigit()]
    return max(numbers) if numbers else None


def log_files(run_dir: str | os.PathLike[str], *, rank: int = 0, attempt: int | None = None) -> LogFiles:
    """The stdout and stderr files of ``rank`` in ``attempt`` (the latest by default). Reads nothing else."""
    paths = run_paths(run_dir)
    state = run_state.load_state(paths)
    if attempt is None:
        attempt = _latest_attempt(paths, state)
    if rank < 0 or (state is not None and state.attempts and rank >= max(a.world_size for a in state.attempts)):
        size = max(a.world_size for a in state.attempts) if state is not None and state.attempts else 1
        raise UsageError(f"--rank {rank}: the job has ranks 0-{size - 1}; give one of them")
    files: list[Path] = []
    if attempt is not None:
        files = [paths.rank_log(attempt, rank, stream) for stream in ("out", "err")]
        files = [file for file in files if file.is_file()]
    if not files and state is not None and state.job_id is not None:
        # Before the runtime redirects its streams (or when it could not start), submitit's own logs.
        files = [file for file in (paths.submitit / f"{state.job_id}_{rank}_log.out",
                                   paths.submitit / f"{state.job_id}_{rank}_log.err") if file.is_file()]
    if not files and paths.controller_log.is_file():
        files = [paths.controller_log]
    return LogFiles(attempt=attempt, rank=rank, files=files)


def follow_logs(run_dir: str | os.PathLike[str], *, rank: int = 0, interval_s: float = 0.5) -> Iterator[tuple[Path, str]]:
    """Yield ``(file, new text)`` from the latest attempt's logs of ``rank`` until the run ends,
    moving on to each new attempt's files. The caller stops whenever it likes."""
    paths = run_paths(run_dir)
    offsets: dict[Path, int] = {}
    probe = LivenessProbe(paths)
    while True:
        state = run_state.load_state(paths)
        state = effective_state(paths, state, probe(state))
        ended = state is None or state.status in run_state.ENDED  # read once more after the end, then stop
        for file in log_files(paths.run_dir, rank=rank).files:
            offset = offsets.get(file, 0)
            with open(file, "rb") as stream:
                stream.seek(offset)
                data = stream.read()
            if data:
                offsets[file] = offset + len(data)
                yield file, data.decode(errors="replace")
        if ended:
            return
        time.sleep(interval_s)


# -- preempt, cancel ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Signalled:
    run_dir: Path
    executor: str
    job_id: str | None
    signal: str
    targets: list[str]  # what got the signal ("pid 1234 (rank 0)", "SLURM job 77")
    note: str | None = None


def recorded_tasks(paths: RunPaths) -> list[dict[str, Any]]:
    """The pid records of the run's tasks that are still that task on this host (checked in /proc)."""
    host = socket.gethostname()
    tasks = []
    for file in sorted(paths.pids.glob("rank-*.json")) if paths.pids.is_dir() else ():
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if record.get("host") not in (None, host):
            continue
        if _is_process_of(_proc_cmdline(pid), paths, "submitit.core._submit"):
            tasks.append(record)
    return tasks


def _live_state(paths: RunPaths) -> run_state.RunState:
    state = run_state.load_state(paths)
    if state is None:
        raise UsageError(f"{paths.run_dir}: no state.json (the job was never submitted); use `elfes submit`")
    return state


def _scancel(arguments: list[str], what: str) -> None:
    completed = _run_command(["scancel", *arguments])
    if completed is None:
        raise ActionFailed(f"cannot {what}: scancel is not on PATH here; run this on the cluster's login node")
    if completed.returncode != 0:
        raise ActionFailed(f"scancel {' '.join(arguments)} failed: {completed.stderr.strip() or completed.returncode}")


def _signal_pids(records: list[dict[str, Any]], signum: int) -> list[str]:
    targets = []
    for record in records:
        try:
            os.kill(int(record["pid"]), signum)
        except ProcessLookupError:
            continue
        targets.append(f"pid {record['pid']} (rank {record.get('rank')}, attempt {record.get('attempt')})")
    return targets


def preempt(run_dir: str | os.PathLike[str]) -> Signalled:
    """Rehearse a preemption: the job's tasks get the requeue signal, save ``last``, are requeued and resume."""
    paths = run_paths(run_dir)
    state = _live_state(paths)
    signum = executors.requeue_signal()
    if state.status not in ("running", "stopping"):
        raise ActionFailed(f"{run_dir}: the run is {state.status}, not running; preempt a running job "
                           "(`elfes status` shows when it runs)")
    if state.executor == "slurm":
        _scancel([f"--signal={signum.name.removeprefix('SIG')}", str(state.job_id)], "preempt")
        return Signalled(paths.run_dir, "slurm", state.job_id, signum.name, [f"SLURM job {state.job_id}"])
    targets = _signal_pids(recorded_tasks(paths), signum)
    if not targets:
        raise ActionFailed(f"{run_dir}: no task of job {state.job_id} has recorded its pid on this machine yet (it "
                           "installs its signal handlers first, a few seconds after it starts); try again shortly")
    return Signalled(paths.run_dir, "local", state.job_id, signum.name, targets)


def cancel(run_dir: str | os.PathLike[str]) -> Signalled:
    """Stop the run for good: a cancel marker first (the attempt ends "cancelled"), then SIGTERM to
    the tasks (local) or ``scancel`` (SLURM). The job saves ``last`` on the way out."""
    paths = run_paths(run_dir)
    state = _live_state(paths)
    live = liveness(paths, state)
    current = effective_state(paths, state, live)
    if current.status in run_state.ENDED:
        return Signalled(paths.run_dir, state.executor, state.job_id, "none", [],
                         note=f"the run is already {current.status}; nothing to cancel")
    write_text_atomically(paths.cancel_marker, json.dumps({"at": run_state.now(), "host": socket.gethostname(),
                                                           "pid": os.getpid()}) + "\n")
    if state.executor == "slurm":
        if state.job_id is None:
            return Signalled(paths.run_dir, "slurm", None, "none", [], note="not submitted yet; the marker stops it")
        _scancel([str(state.job_id)], "cancel")
        return Signalled(paths.run_dir, "slurm", state.job_id, "SIGTERM", [f"SLURM job {state.job_id} (scancel)"])
    targets = _signal_pids(recorded_tasks(paths), signal.SIGTERM)
    note = None
    if not targets:
        # Tasks still starting: the controller forwards SIGTERM, and the runtime sees the marker.
        for pid in local_processes(paths)["controller"]:
            try:
                os.kill(pid, signal.SIGTERM)
                targets.append(f"pid {pid} (the local controller, which forwards it to the tasks)")
            except ProcessLookupError:
                pass
        note = "no task had recorded its pid yet; a starting task sees the cancel marker"
    return Signalled(paths.run_dir, "local", state.job_id, "SIGTERM", targets, note=note)


# -- follow -------------------------------------------------------------------------------------------------------
class EventTail:
    """New complete lines of a run's ``events.jsonl`` since the last call (a torn last line waits)."""

    def __init__(self, paths: RunPaths, *, from_start: bool = True) -> None:
        self.file = paths.events
        self.offset = 0
        if not from_start and self.file.is_file():
            self.offset = self.file.stat().st_size  # only what is written from now on

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.file, "rb") as stream:
                stream.seek(self.offset)
                data = stream.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        events = []
        for line in data[:end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "event" in event:
                events.append(event)
        return events


@dataclass(frozen=True)
class Snapshot:
    """One look at a followed run: the events written since the previous look, and its state."""

    events: list[dict[str, Any]]
    state: run_state.RunState | None
    queue_state: str | None
    ended: bool


def watch(run_dir: str | os.PathLike[str], *, from_start: bool = True, interval_s: float = 0.5) -> Iterator[Snapshot]:
    """Snapshots of a run until it ends (its last snapshot has ``ended`` true). Reads files only.
    ``from_start``: replay the run records already written (else only new ones)."""
    paths = run_paths(run_dir)
    tail = EventTail(paths, from_start=from_start)
    probe = LivenessProbe(paths)
    while True:
        state = run_state.load_state(paths)
        live = probe(state)
        state = effective_state(paths, state, live)
        ended = state is not None and state.status in run_state.ENDED
        yield Snapshot(tail.read(), state, live.queue_state, ended)
        if ended:
            return
        time.sleep(interval_s)
