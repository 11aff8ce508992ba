"""``elfes rehearse JOB.yaml``: run the user's own job twice straight and once interrupted, compare
the end states tensor by tensor, and give a verdict: exact, not resumable, or not reproducible.

The three runs live beside each other in ``<run_dir>.rehearsal/`` (``straight-1``, ``interrupted``,
``straight-2``), never in the spec's own ``run_dir``. Each is an ordinary run directory submitted
through the same executor as ``elfes submit``; the interruptions are the real ones: the requeue
signal (``elfes preempt``), SIGTERM then ``elfes resume``, and SIGKILL (possibly inside a checkpoint
write) then ``elfes resume``. The straight runs come first: when they differ, the job is not
reproducible, resume cannot be judged, and the interrupted run is skipped.

>>> rehearsal = prepare("job.yaml", RehearsalOptions(interruptions=3, overrides=("config.epochs=2",)))
>>> report = rehearsal.run(print)
>>> report.verdict
'exact'

This module orchestrates and is torch-free; launcher/commands/rehearsal_compare.py loads the checkpoints.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from elfes.files import is_temporary, write_text_atomically

from ..rundir import state as run_state
from ..rundir.liveness import effective_state, liveness, local_processes, recorded_tasks, run_slurm_tool
from ..rundir.lookup import UsageError
from ..rundir.paths import RunPaths
from ..spec import JobSpec
from ..spec.overrides import load_spec_with
from ..submit import executors
from .logs import EventTail
from .rehearsal_causes import likely_causes, reproducibility_advice
from .rehearsal_compare import Comparison, compare_runs
from .signalling import preempt
from .submission import resume, submit

KINDS = ("requeue", "stop", "kill")
VERDICTS = ("exact", "not resumable", "not reproducible")
RUN_NAMES = ("straight-1", "interrupted", "straight-2")
REPORT_FILE = "report.json"


class RehearsalFailed(RuntimeError):
    """A run of the rehearsal did not finish (it failed, or a phase timed out): no verdict."""


@dataclass(frozen=True)
class RehearsalOptions:
    interruptions: int = 3
    kinds: tuple[str, ...] = KINDS
    seed: int = 0
    executor: str = "auto"
    overrides: tuple[str, ...] = ()
    keep: bool = False


@dataclass(frozen=True)
class PlannedInterruption:
    kind: str
    step: int  # interrupt once the run has logged this step...
    fraction: float  # ...and this fraction of one update's time later (mid-window)


@dataclass
class Interruption:
    """One interruption as it happened: what was sent, at which step, and what the run saved."""

    kind: str
    planned_step: int
    step: int | None  # the latest step the run had logged when it was interrupted
    moment: str  # e.g. "0.42 of an update after step 7", "during the checkpoint write of step 8"
    attempt: int | None  # the attempt it ended
    saved_step: int | None = None  # the step the attempt saved in `last` (requeue, stop), if recorded
    landed: bool = True  # False when the run had finished, or saved its last update: nothing was resumed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    verdict: str
    spec: str
    rehearsal_dir: str
    seed: int
    executor: str
    interruptions: list[Interruption]
    straight: Comparison
    interrupted: Comparison | None  # None when the straight runs differ (the interrupted run is skipped)
    likely_causes: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def differences(self) -> Comparison:
        """The comparison the verdict rests on."""
        return self.interrupted if self.verdict != "not reproducible" and self.interrupted else self.straight

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "spec": self.spec, "rehearsal_dir": self.rehearsal_dir, "seed": self.seed,
            "executor": self.executor, "interruptions": [i.to_json() for i in self.interruptions],
            "differences": {**self.differences.to_json(),
                            "compared": ("straight-2 vs straight-1" if self.verdict == "not reproducible"
                                         else "interrupted vs straight-1")},
            "straight_vs_straight": self.straight.to_json(),
            "interrupted_vs_straight": self.interrupted.to_json() if self.interrupted else None,
            "likely_causes": self.likely_causes, "advice": self.advice, "runs": self.runs,
        }


def plan_interruptions(count: int, kinds: Sequence[str], steps: Sequence[int], seed: int) -> list[PlannedInterruption]:
    """``count`` interruptions spread over ``steps`` (the steps a straight run logged before its last: the
    moments a follower can see), one per equal segment at a seeded random step in it and a random moment
    within the next update; the kinds cycled so that each one occurs."""
    rng = random.Random(seed)
    order = [kinds[i % len(kinds)] for i in range(count)]
    rng.shuffle(order)
    steps = sorted(set(steps)) or [1]
    planned = []
    for index, kind in enumerate(order):
        low = (len(steps) * index) // count
        high = max(low, (len(steps) * (index + 1)) // count - 1)
        planned.append(PlannedInterruption(kind, steps[rng.randint(low, high)], round(rng.random(), 3)))
    return planned


# -- preparing: everything checked before anything is created -------------------------------------------------
def prepare(spec_file: str | os.PathLike[str], options: RehearsalOptions) -> Rehearsal:
    """Check the spec (with ``options.overrides``), the kinds, the count and the executor; create nothing."""
    if options.interruptions < 1:
        raise UsageError(f"--interruptions {options.interruptions}: give 1 or more (the default is 3)")
    unknown = [kind for kind in options.kinds if kind not in KINDS]
    if unknown or not options.kinds:
        raise UsageError(f"--kinds {','.join(options.kinds)!s}: {'unknown kind ' + repr(unknown[0]) if unknown else 'empty'};"
                         f" give a comma-separated list of {', '.join(KINDS)}")
    source = Path(spec_file)
    spec = load_spec_with(source, options.overrides)
    executor = executors.choose_executor(options.executor)
    executors.check_executor(spec, executor)
    folder = Path(f"{spec.run_dir}.rehearsal")
    _check_reusable(folder)
    return Rehearsal(source, spec, replace(options, executor=executor), folder)


def _check_reusable(folder: Path) -> None:
    """A rehearsal folder may be reused when it holds only a previous rehearsal, none of it alive."""
    if not folder.exists():
        return
    ours = {REPORT_FILE, *RUN_NAMES, *(f"{name}.yaml" for name in RUN_NAMES)}
    foreign = sorted(entry.name for entry in folder.iterdir() if entry.name not in ours)
    if foreign:
        raise UsageError(f"{folder} exists and holds {', '.join(foreign[:3])}, which a rehearsal did not write; "
                         "move it away (the rehearsal writes its scratch runs there)")
    for name in RUN_NAMES:
        paths = RunPaths(folder / name)
        state = run_state.load_state(paths)
        if state is not None and liveness(paths, state).alive:
            raise run_state.StateError(f"{paths.run_dir}: a job of an earlier rehearsal is still alive; "
                                       f"`elfes cancel {paths.run_dir}` it first")


# -- running --------------------------------------------------------------------------------------------------
@dataclass
class Rehearsal:
    source: Path
    spec: JobSpec
    options: RehearsalOptions
    folder: Path
    say: Callable[[str], None] = print
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def run(self, say: Callable[[str], None] = print) -> Report:
        """Run straight-1 and straight-2, then (when they agree) the interrupted run; compare, write the
        report; return it."""
        self.say = say
        for name in RUN_NAMES:
            for stale in (self.folder / name, self.folder / f"{name}.yaml"):
                shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        say(f"rehearsal of {self.source} in {self.folder} ({self.options.executor}, seed {self.options.seed})")
        interruptions: list[Interruption] = []
        resumed: Comparison | None = None
        try:
            straight_1 = self._straight("straight-1")
            straight_2 = self._straight("straight-2")
            say("comparing straight-2 with straight-1 (every tensor with torch.equal, the logged metrics step by step)")
            straight = compare_runs(straight_2, straight_1)
            if straight.identical:
                events = _events(straight_1)
                plan = plan_interruptions(self.options.interruptions, self.options.kinds, _logged_steps(events),
                                          self.options.seed)
                interruptions = self._interrupted(plan, step_time_s=_update_time_s(events),
                                                  checkpoint_steps=_checkpoint_steps(events))
                if not any(interruption.landed for interruption in interruptions):
                    raise RehearsalFailed(f"the interrupted run of {self.source} finished before any interruption "
                                          "landed ahead of its last update, so no resume was tried; give it a "
                                          "longer budget (--set config.epochs=...)")
                say("comparing the interrupted run with straight-1")
                resumed = compare_runs(self.folder / "interrupted", straight_1)
            else:
                say("the straight runs differ: resume cannot be judged, so the interrupted run is skipped")
        except BaseException:
            self._end_live_runs()
            raise
        verdict = ("not reproducible" if not straight.identical else
                   "exact" if resumed is not None and resumed.identical else "not resumable")
        report = Report(verdict, str(self.source), str(self.folder), self.options.seed, self.options.executor,
                        interruptions, straight, resumed, runs=self.runs)
        if verdict == "not resumable":
            report.likely_causes = likely_causes(self.spec, resumed, interruptions, _events(self.folder / "interrupted"))
        elif verdict == "not reproducible":
            report.advice = reproducibility_advice(self.spec, straight)
        write_text_atomically(self.folder / REPORT_FILE, json.dumps(report.to_json(), indent=2, default=str) + "\n")
        if verdict == "exact" and not self.options.keep:
            for name in RUN_NAMES:
                shutil.rmtree(self.folder / name, ignore_errors=True)
                (self.folder / f"{name}.yaml").unlink(missing_ok=True)
        return report

    # -- the runs ---------------------------------------------------------------------------------------------
    def _submit(self, name: str) -> Path:
        data = yaml.safe_load(self.spec.to_yaml())
        data["run_dir"] = str(self.folder / name)
        data["name"] = f"{self.spec.name}.{name}"[:128]
        spec_file = self.folder / f"{name}.yaml"
        write_text_atomically(spec_file, yaml.safe_dump(data, sort_keys=False))
        submitted = submit(spec_file, executor=self.options.executor)
        self.say(f"{name}: submitted as {submitted.executor} job {submitted.job_id}")
        self.runs[name] = {"run_dir": str(submitted.run_dir), "started_at": time.time()}
        return submitted.run_dir

    def _straight(self, name: str) -> Path:
        run_dir = self._submit(name)
        state = self._wait_until_ended(run_dir, name)
        self.say(f"{name}: finished at step {state.last_attempt.step if state.last_attempt else '?'}")
        return run_dir

    def _interrupted(self, plan: list[PlannedInterruption], *, step_time_s: float,
                     checkpoint_steps: list[int]) -> list[Interruption]:
        run_dir = self._submit("interrupted")
        paths, tail = RunPaths(run_dir), EventTail(RunPaths(run_dir))
        progress = _Progress(tail)
        done: list[Interruption] = []
        for number, planned in enumerate(plan, start=1):
            progress.poll()
            target = planned.step
            # One kill lands inside a checkpoint write where the run writes them: aim at the first one from here.
            aim_at_write = planned.kind == "kill" and not any(i.kind == "kill" for i in done)
            next_step = plan[number].step if number < len(plan) else None
            write_steps = [step for step in checkpoint_steps if step >= target and (next_step is None or step < next_step)]
            if aim_at_write and write_steps:
                target = max(1, write_steps[0] - 1)
            attempt = self._wait_for_step(paths, progress, target)
            if attempt is None:
                self.say(f"interruption {number}/{len(plan)} ({planned.kind} at step {planned.step}): the run ended "
                         "first; not sent")
                continue
            if aim_at_write and write_steps:
                moment = self._wait_for_checkpoint_write(paths, progress, step_time_s)
            else:
                time.sleep(planned.fraction * step_time_s)  # a random moment within the update, not a wait for one
                moment = f"{planned.fraction:.2f} of an update after step {progress.poll()}"
            interruption = Interruption(planned.kind, planned.step, progress.step, moment, attempt)
            self.say(f"interruption {number}/{len(plan)}: {planned.kind} at step {progress.step} ({moment}), "
                     f"attempt {attempt}")
            getattr(self, f"_{planned.kind}")(paths, attempt, interruption)
            if not interruption.landed:
                self.say(f"interruption {number}/{len(plan)}: the run had finished before it landed")
            done.append(interruption)
        state = self._wait_until_ended(run_dir, "interrupted")
        final_step = state.last_attempt.step if state.last_attempt else None
        self.say(f"interrupted: finished at step {final_step if final_step is not None else '?'} after "
                 f"{len(state.attempts)} attempts")
        for interruption in after_the_last_update(done, final_step):
            self.say(f"interruption {done.index(interruption) + 1}/{len(plan)}: it saved the run's last update "
                     f"(step {final_step}), so nothing was resumed; it does not count as landed")
        return done

    # -- the three kinds ----------------------------------------------------------------------------------------
    def _requeue(self, paths: RunPaths, attempt: int, interruption: Interruption) -> None:
        preempt(paths.run_dir)
        state = self._wait(paths, lambda s: s.status in run_state.ENDED or (len(s.attempts) > attempt
                                                                           and s.status in ("running", "stopping")),
                           "the requeued run to start its next attempt")
        interruption.saved_step = state.attempts[attempt - 1].step
        interruption.landed = state.attempts[attempt - 1].outcome != "finished"
        if state.status == "stopped":  # no requeue left (requeue.max_requeues): continue by hand
            self._resume_when_gone(paths)

    def _stop(self, paths: RunPaths, attempt: int, interruption: Interruption) -> None:
        state = run_state.load_state(paths)
        if state.executor == "slurm":
            _slurm(["scancel", "--signal=TERM", str(state.job_id)])
        else:
            _signal_tasks(paths, signal.SIGTERM)
        state = self._wait(paths, lambda s: s.attempts[attempt - 1].ended and s.status in run_state.ENDED,
                           "the stopped run to save `last` and end")
        interruption.saved_step = state.attempts[attempt - 1].step
        interruption.landed = state.attempts[attempt - 1].outcome != "finished"
        if state.executor == "slurm" and interruption.landed:
            _slurm(["scancel", str(state.job_id)])  # it saved and waits for SLURM to end it
        self._resume_when_gone(paths)

    def _kill(self, paths: RunPaths, attempt: int, interruption: Interruption) -> None:
        state = run_state.load_state(paths)
        if state.executor == "slurm":
            _slurm(["scancel", "--full", "--signal=KILL", str(state.job_id)])
        else:
            _kill_process_tree(local_processes(paths)["controller"] + local_processes(paths)["task"])
        self._resume_when_gone(paths, interruption)

    def _resume_when_gone(self, paths: RunPaths, interruption: Interruption | None = None) -> None:
        state = self._wait(paths, lambda s: liveness(paths, s).alive is False, "the interrupted job to be gone",
                           raw=True)
        if state.status == "finished":  # it finished before the interruption reached it: nothing to resume
            if interruption is not None:
                interruption.landed = False
            return
        submitted = resume(paths.run_dir)
        self.say(f"interrupted: resumed as {submitted.executor} job {submitted.job_id}")

    def _wait_for_checkpoint_write(self, paths: RunPaths, progress: _Progress, step_time_s: float) -> str:
        """Hold the kill until a checkpoint file is being written: a kill inside a write must leave `last`
        loadable. A write too quick to be seen is followed by the kill right after it is published."""
        deadline = time.monotonic() + max(5.0, 4 * step_time_s)
        published = progress.checkpoints
        while time.monotonic() < deadline:
            if paths.checkpoints.is_dir() and any(is_temporary(entry) for entry in os.scandir(paths.checkpoints)):
                return f"during the checkpoint write after step {progress.poll()}"
            progress.poll()
            if progress.checkpoints > published:
                return f"right after the checkpoint of step {progress.step} was published"
            time.sleep(0.001)
        return f"after step {progress.poll()} (no checkpoint write seen)"

    # -- waiting --------------------------------------------------------------------------------------------------
    def _wait(self, paths: RunPaths, condition: Callable[[run_state.RunState], bool], what: str, *,
              raw: bool = False) -> run_state.RunState:
        deadline = time.monotonic() + self._phase_timeout_s()
        while True:
            state = run_state.load_state(paths)
            if state is not None:
                current = state if raw else effective_state(paths, state, liveness(paths, state))
                if condition(current):
                    return current
                if not raw and current.status == "failed":
                    raise RehearsalFailed(_failure(paths, current))
            if time.monotonic() > deadline:
                raise RehearsalFailed(f"{paths.run_dir}: timed out after {self._phase_timeout_s():.0f} s waiting for "
                                      f"{what} (status {state.status if state else 'not submitted'}); see "
                                      f"`elfes logs {paths.run_dir}`")
            time.sleep(0.1)

    def _wait_for_step(self, paths: RunPaths, progress: _Progress, step: int) -> int | None:
        """Wait until the run is running with its tasks recorded and has logged ``step``; the attempt, or None
        when the run ended first."""
        def ready(state: run_state.RunState) -> bool:
            progress.poll()
            if state.status in run_state.ENDED:
                return True
            tasks = recorded_tasks(paths) if state.executor == "local" else [True]
            return state.status == "running" and bool(tasks) and progress.step >= step
        state = self._wait(paths, ready, f"step {step}")
        return None if state.status in run_state.ENDED else len(state.attempts)

    def _wait_until_ended(self, run_dir: Path, name: str) -> run_state.RunState:
        paths = RunPaths(run_dir)
        state = self._wait(paths, lambda s: s.status in run_state.ENDED, f"{name} to end")
        self.runs[name]["wall_s"] = round(time.time() - self.runs[name].pop("started_at"), 1)
        self.runs[name]["attempts"] = len(state.attempts)
        if state.status != "finished":
            raise RehearsalFailed(_failure(paths, state))
        return state

    def _phase_timeout_s(self) -> float:
        return self.spec.resources.timeout_min * 60.0 + 120.0

    def _end_live_runs(self) -> None:
        """On the way out without a verdict (Ctrl-C, a failure): end the scratch jobs still alive."""
        for name in RUN_NAMES:
            paths = RunPaths(self.folder / name)
            state = run_state.load_state(paths) if paths.state.is_file() else None
            if state is None or not liveness(paths, state).alive:
                continue
            if state.executor == "slurm":
                _slurm(["scancel", str(state.job_id)])
            else:
                _kill_process_tree(local_processes(paths)["controller"] + local_processes(paths)["task"])


class _Progress:
    """The latest step the current attempt has logged (any event with a step), read incrementally."""

    def __init__(self, tail: EventTail) -> None:
        self.tail = tail
        self.step = 0
        self.checkpoints = 0

    def poll(self) -> int:
        for event in self.tail.read():
            if event.get("event") in ("started", "resumed"):
                self.step = int(event["state"]["step"])  # a new attempt: a kill replays from its checkpoint
            elif isinstance(event.get("step"), int):
                self.step = max(self.step, event["step"])
            if event.get("event") == "checkpoint":
                self.checkpoints += 1
        return self.step


def after_the_last_update(interruptions: list[Interruption], final_step: int | None) -> list[Interruption]:
    """Mark as not landed each interruption whose attempt saved the run's final step (its signal arrived in
    the last update): the relaunch had nothing left to train, so it proves nothing about resume."""
    late = [i for i in interruptions if i.landed and final_step is not None and i.saved_step is not None
            and i.saved_step >= final_step]
    for interruption in late:
        interruption.landed = False
    return late


# -- helpers --------------------------------------------------------------------------------------------------
def _events(run_dir: Path) -> list[dict[str, Any]]:
    from elfes.records import read_events

    return read_events(run_dir)


def _logged_steps(events: list[dict[str, Any]]) -> list[int]:
    """The steps a straight run logged (train records) before its final one."""
    steps = sorted({int(e["step"]) for e in events if e.get("event") == "train"})
    if not any(e.get("event") == "started" for e in events):
        raise RehearsalFailed("the straight run recorded no `started` event; does main(job) use "
                              "RunLogger(job.run_dir)?")
    return steps[:-1] or steps


def _update_time_s(events: list[dict[str, Any]]) -> float:
    """Seconds per optimizer update in a straight run, from its train records."""
    train = [(e["step"], datetime.fromisoformat(e["time"]).timestamp()) for e in events if e.get("event") == "train"]
    if len(train) < 2 or train[-1][0] == train[0][0]:
        return 0.05
    return max(0.0, (train[-1][1] - train[0][1]) / (train[-1][0] - train[0][0]))


def _checkpoint_steps(events: list[dict[str, Any]]) -> list[int]:
    return [int(e["step"]) for e in events if e.get("event") == "checkpoint" and e.get("reason") in ("interval", "best")]


def _failure(paths: RunPaths, state: run_state.RunState) -> str:
    error = f": {state.error}" if state.error else ""
    return (f"{paths.run_dir} ended {state.status}{error}; the rehearsal has no verdict. See "
            f"`elfes logs {paths.run_dir}`, fix the job, and rehearse again")


def _signal_tasks(paths: RunPaths, signum: int) -> None:
    for record in recorded_tasks(paths):
        try:
            os.kill(int(record["pid"]), signum)
        except ProcessLookupError:
            pass


def _children(pids: Sequence[int]) -> list[int]:
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


def _kill_process_tree(pids: Sequence[int]) -> None:
    """SIGKILL a local job as a power cut would: every process frozen first, so none reacts to another's death."""
    tree = _children(pids)
    for signum in (signal.SIGSTOP, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass


def _slurm(argv: list[str]) -> None:
    completed = run_slurm_tool(argv)
    if completed is None or completed.returncode != 0:
        said = "not on PATH" if completed is None else (completed.stderr.strip() or completed.returncode)
        raise RehearsalFailed(f"`{' '.join(argv)}` failed: {said}")


__all__ = ["KINDS", "VERDICTS", "Interruption", "PlannedInterruption", "RehearsalFailed", "RehearsalOptions",
           "Report", "plan_interruptions", "prepare"]
