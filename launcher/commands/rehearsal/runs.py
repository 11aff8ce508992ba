"""Running the scratch runs of ``elfes rehearse``: submitting each through ``elfes submit``'s path,
following its progress (records where the job keeps them, else its checkpoint files at the straight
run's pace), waiting on its state, and ending what is left alive on the way out. Torch-free.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from elfes.contract import START_EVENTS, EventKind, Pointer
from elfes.files import write_text_atomically

from ...backends import backend_for
from ...rundir import state as run_state
from ...rundir.liveness import LivenessProbe, effective_state, liveness, local_processes, recorded_tasks
from ...rundir.paths import RunPaths
from ...rundir.provenance import Provenance, changes_between
from ...rundir.state import RunStatus
from ...slurm import Answer
from ...spec import JobSpec
from ..logs import EventTail
from ..submission import submit
from .plan import RehearsalFailed, RunLength, checkpoint_files, pointer_step, timestamp

RUN_NAMES = ("straight-1", "interrupted", "straight-2")
GONE_TIMEOUT_S = 60.0  # how long a finished scratch job's processes get to exit before the job is ended
# show(run name, step, total or None): called on every look at a run; the caller decides what to draw.
Show = Callable[[str, int, "int | None"], None]


class Follower:
    """How far a run has trained: the latest step its current attempt logged where it keeps records; else
    its newest checkpoint file, moved on by the time since at the straight run's pace (``length``)."""

    def __init__(self, paths: RunPaths, length: RunLength | None = None) -> None:
        self.paths, self.length = paths, length
        self.tail = EventTail(paths)
        self.logged = 0
        self.total = length.final_step if length else None
        self.published: set[str] = set()  # checkpoint files seen: a new one is a published checkpoint
        self.step = 0
        self.began: float | None = None  # when the newest attempt start seen in the records was logged

    @property
    def checkpoints(self) -> int:
        return len(self.published)

    def poll(self) -> int:
        records = False
        for event in self.tail.read():
            records = records or event.get("event") == EventKind.TRAIN
            if event.get("event") in START_EVENTS:
                self.logged = int(event["state"]["step"])  # a new attempt: a kill replays from its checkpoint
                self.began = timestamp(event["time"]) if isinstance(event.get("time"), str) else self.began
                planned = (event.get("budget") or {}).get("planned_steps")
                self.total = self.total or (planned if isinstance(planned, int) else None)
            elif isinstance(event.get("step"), int):
                self.logged = max(self.logged, event["step"])
        files = checkpoint_files(self.paths)
        self.published |= {f"{step}@{mtime}" for step, mtime in files}
        if self.length is None or self.length.records:
            if self._attempt_unrecorded():  # the previous attempt's steps are not this one's
                self.logged = pointer_step(self.paths) or 0
            self.step = max(self.logged, files[-1][0] if files and self.length is None else 0)
        else:
            self.step = self._estimate(files)
        return self.step

    def _attempt_unrecorded(self) -> bool:
        """Whether the run's current attempt began (state.json) but has not logged its start yet: until it
        does it stands where `last` points, not at the step an earlier attempt reached (a kill loses steps)."""
        state = run_state.load_state(self.paths) if self.paths.state.is_file() else None
        attempt = state.last_attempt if state is not None else None
        if state is None or attempt is None or attempt.ended or state.status not in (RunStatus.RUNNING, RunStatus.STOPPING):
            return False
        return self.began is None or self.began < timestamp(attempt.started_at)

    def _estimate(self, files: list[tuple[int, float]]) -> int:
        state = run_state.load_state(self.paths) if self.paths.state.is_file() else None
        attempt = state.last_attempt if state is not None else None
        length = self.length
        if attempt is None or attempt.ended or length is None:
            return files[-1][0] if files else 0
        start = timestamp(attempt.started_at)
        own = [(step, mtime) for step, mtime in files if mtime >= start]
        before = [step for step, mtime in files if mtime < start]
        base_step, base_time = own[-1] if own else (max(before, default=0), start + length.startup_s)
        pace = max(length.update_time_s, 1e-3)
        return min(length.final_step, base_step + max(0, int((time.time() - base_time) / pace)))


@dataclass
class ScratchRuns:
    """The rehearsal's three runs in ``folder``: submitted, followed, waited on, ended."""

    spec: JobSpec
    executor: str
    folder: Path
    say: Callable[[str], None] = print
    show: Show | None = None
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    provenance: dict[str, list[tuple[int, Provenance | None]]] = field(default_factory=dict)

    def environment_notes(self) -> list[str]:
        """Every change of a bitwise field (torch, CUDA, cuDNN, GPU model, threads) from the first attempt of the
        first run to any attempt of any run: what makes a rehearsal's comparison say little about the job."""
        recorded = [(name, number, provenance) for name, attempts in self.provenance.items()
                    for number, provenance in attempts if provenance is not None]
        if not recorded:
            return []
        first_name, first_number, first = recorded[0]
        notes = []
        for name, number, provenance in recorded[1:]:
            for change in changes_between(first, provenance, earlier=first_number, later=number):
                notes.append(f"{name} vs {first_name}: {change}")
        return notes

    def submit(self, name: str) -> Path:
        data = yaml.safe_load(self.spec.to_yaml())
        data["run_dir"] = str(self.folder / name)
        data["name"] = f"{self.spec.name}.{name}"[:128]
        spec_file = self.folder / f"{name}.yaml"
        write_text_atomically(spec_file, yaml.safe_dump(data, sort_keys=False))
        submitted = submit(spec_file, executor=self.executor)
        self.say(f"{name}: submitted as {submitted.executor} job {submitted.job_id}")
        self.runs[name] = {"run_dir": str(submitted.run_dir), "started_at": time.time()}
        return submitted.run_dir

    def straight(self, name: str, length: RunLength | None) -> Path:
        run_dir = self.submit(name)
        state = self.wait_until_ended(run_dir, name, Follower(RunPaths(run_dir), length))
        step = state.last_attempt.step if state.last_attempt else None
        step = step if step is not None else pointer_step(RunPaths(run_dir), Pointer.FINAL)  # a command without records
        self.say(f"{name}: finished at step {step if step is not None else '?'}")
        return run_dir

    def wait(self, paths: RunPaths, condition: Callable[[run_state.RunState], bool], what: str, *,
             raw: bool = False, follower: Follower | None = None) -> run_state.RunState:
        deadline = time.monotonic() + self.phase_timeout_s()
        # state.json is read every 0.1 s; the job's processes are looked for at the backend's pace (a pass over
        # /proc costs more than all the rest of a look).
        probe = LivenessProbe(paths, at_most_every_s=1.0)
        while True:
            if follower is not None:
                step = follower.poll()
                if self.show is not None:
                    self.show(paths.run_dir.name, step, follower.total)
            state = run_state.load_state(paths)
            if state is not None:
                current = state if raw else effective_state(paths, state, probe(state))
                if not raw and current.status == RunStatus.FAILED:  # before the condition: a failure ends the rehearsal
                    raise RehearsalFailed(failure(paths, current))
                if condition(current):
                    return current
            if time.monotonic() > deadline:
                raise RehearsalFailed(f"{paths.run_dir}: timed out after {self.phase_timeout_s():.0f} s waiting for "
                                      f"{what} (status {state.status if state else 'not submitted'}); see "
                                      f"`elfes logs {paths.run_dir}`")
            time.sleep(0.1)

    def wait_until_ended(self, run_dir: Path, name: str, follower: Follower | None = None) -> run_state.RunState:
        paths = RunPaths(run_dir)
        state = self.wait(paths, lambda s: s.status in run_state.ENDED, f"{name} to end", follower=follower)
        if follower is not None and self.show is not None:
            self.show(name, follower.poll(), follower.total)
        self.runs[name]["wall_s"] = round(time.time() - self.runs[name].pop("started_at"), 1)
        self.runs[name]["attempts"] = len(state.attempts)
        # What each attempt ran on (launcher/rundir/provenance.py): the report shows it and names changes.
        self.runs[name]["provenance"] = [dataclasses.asdict(attempt.provenance) if attempt.provenance else None
                                         for attempt in state.attempts]
        self.provenance[name] = [(attempt.number, attempt.provenance) for attempt in state.attempts]
        if state.status != RunStatus.FINISHED:
            raise RehearsalFailed(failure(paths, state))
        return state

    def phase_timeout_s(self) -> float:
        return self.spec.resources.timeout_min * 60.0 + 120.0

    def end_live_runs(self) -> list[str]:
        """On the way out without a verdict (a signal, a failure): end the scratch jobs still alive; their names."""
        ended = []
        for name in RUN_NAMES:
            paths = RunPaths(self.folder / name)
            state = run_state.load_state(paths) if paths.state.is_file() else None
            if state is None or not liveness(paths, state).alive:
                continue
            end_job(paths, state)
            ended.append(name)
        return ended


def failure(paths: RunPaths, state: run_state.RunState) -> str:
    error = f": {state.error}" if state.error else ""
    return (f"{paths.run_dir} ended {state.status}{error}; the rehearsal has no verdict. See "
            f"`elfes logs {paths.run_dir}`, fix the job, and rehearse again")


# -- processes ------------------------------------------------------------------------------------------------
def remove_run_dir(run_dir: Path, timeout_s: float = GONE_TIMEOUT_S) -> None:
    """Remove scratch run ``run_dir`` once no process of its job is alive: wait for that at most ``timeout_s``, then
    end the job (a rehearsal's own scratch job, as :meth:`ScratchRuns.end_live_runs` does) and wait for its end
    as long again. Raises RehearsalFailed, naming the folder, where it cannot be removed."""
    paths = RunPaths(run_dir)
    # A scratch job that recorded its end leaves SLURM's queue within seconds: asked every 5 s, not every 30.
    probe = LivenessProbe(paths, at_most_every_s=5.0)
    state = wait_gone(paths, probe, timeout_s)
    if state is not None:
        end_job(paths, state)
        state = wait_gone(paths, probe, timeout_s)
    if not run_dir.exists():
        return  # never created (a run an earlier rehearsal did not reach)
    try:
        shutil.rmtree(run_dir)
    except OSError as error:
        alive = f"; its {state.executor} job {state.job_id} was ended but is still alive" if state is not None else ""
        raise RehearsalFailed(f"{run_dir} could not be removed: {error}{alive}; remove the folder once nothing "
                              "writes into it, and rehearse again") from None


def wait_gone(paths: RunPaths, probe: LivenessProbe, timeout_s: float) -> run_state.RunState | None:
    """Wait (at most ``timeout_s``) until no process of the run's job is alive; the run's state where one still
    is, else None."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = run_state.load_state(paths) if paths.state.is_file() else None
        if state is None or not probe(state).alive:
            return None
        if time.monotonic() > deadline:
            return state
        time.sleep(0.1)  # reading state.json; the probe asks /proc or SLURM at its own pace


def end_job(paths: RunPaths, state: run_state.RunState) -> None:
    """End the run's job now: scancel on SLURM, SIGKILL to every process of a local job."""
    if not backend_for(state.executor).runs_here:
        slurm(backend_for(state.executor).cancel(str(state.job_id)))
    else:
        kill_local_job(paths)


def signal_tasks(paths: RunPaths, signum: int) -> None:
    for record in recorded_tasks(paths):
        try:
            os.kill(int(record["pid"]), signum)
        except ProcessLookupError:
            pass


def kill_local_job(paths: RunPaths) -> None:
    """SIGKILL every process of a local job: its controller, its tasks and their commands' groups."""
    found = local_processes(paths)
    kill_process_tree(found["controller"] + found["task"] + found["command"])


def descendants(pids: Sequence[int]) -> list[int]:
    """``pids`` and all their descendants (from /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(parent, []).append(int(entry.name))
    found, queue = [], list(pids)
    while queue:
        pid = queue.pop()
        if pid not in found:
            found.append(pid)
            queue += parents.get(pid, [])
    return found


def kill_process_tree(pids: Sequence[int]) -> None:
    """SIGKILL a local job as a power cut would: every process frozen first, so none reacts to another's death."""
    tree = descendants(pids)
    for signum in (signal.SIGSTOP, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass


def slurm(completed: Answer) -> None:
    """Raises RehearsalFailed where the SLURM command (launcher/slurm) that ``completed`` answers for failed."""
    if not completed.ok:
        said = "not on PATH" if not completed.started else (completed.stderr.strip() or completed.code)
        raise RehearsalFailed(f"`{completed.command}` failed: {said}")
