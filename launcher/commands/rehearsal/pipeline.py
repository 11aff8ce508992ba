"""``elfes rehearse JOB.yaml``: run the user's own job twice straight and once interrupted, compare
the end states tensor by tensor, and give a verdict: exact, not resumable, or not reproducible.

The three runs live beside each other in ``<run_dir>.rehearsal/`` (``straight-1``, ``interrupted``,
``straight-2``), never in the spec's own ``run_dir``; a sweep's member NAME (``--member``) is
rehearsed in ``<sweep run_dir>.rehearsal/NAME/``. Each is an ordinary run directory submitted
through the same executor as ``elfes submit``; the interruptions are the real ones: the requeue
signal (``elfes preempt``), SIGTERM then ``elfes resume``, and SIGKILL (possibly inside a checkpoint
write) then ``elfes resume``. The straight runs come first: when they differ, the job is not
reproducible, resume cannot be judged, and the interrupted run is skipped. An interrupted run in
which an interruption missed (it came after the last update) is run again with earlier moments.

>>> rehearsal = prepare("job.yaml", RehearsalOptions(interruptions=3, overrides=("config.epochs=2",)))  # doctest: +SKIP
>>> report = rehearsal.run(print)  # doctest: +SKIP
>>> report.summary  # doctest: +SKIP
'exact (requeue, stop, kill: 3 of 3 landed)'

The modules: planning the moments (plan.py), running (runs.py, interrupt.py), comparing (compare.py, torch
inside its functions), reporting (report.py, causes.py). This one orchestrates and is torch-free.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from elfes.files import write_text_atomically
from elfes.records.tracking import TrackingSettings

from ...rundir import state as run_state
from ...rundir.liveness import liveness
from ...rundir.lookup import UsageError
from ...rundir.paths import RunPaths
from ...spec import JobSpec
from ...spec.loading import validate_spec_data
from ...spec.overrides import apply_overrides, describe_source, load_spec_with, parse_overrides
from ...spec.sweep import plan_sweep, wants_sweep
from ...submit import executors
from ...submit.handover import Interrupted
from .causes import likely_causes, reproducibility_advice, resize_causes
from .compare import (
    Comparison,
    Resized,
    compare_runs,
    generator_note,
    judge_resized,
    read_records,
    unused_generators,
)
from .interrupt import InterruptedRun
from .plan import (
    PlannedInterruption,
    RehearsalFailed,
    RunLength,
    candidate_steps,
    measure_length,
    plan_interruptions,
)
from .report import VERDICTS, Interruption, Report, after_the_last_update, decide_verdict
from .runs import RUN_NAMES, ScratchRuns, Show, remove_run_dir

KINDS = ("requeue", "stop", "kill")
REPORT_FILE = "report.json"
PASSES = 3  # the interrupted run and up to two retries with earlier moments
# Signals that end a rehearsal like Ctrl-C does: its scratch jobs ended, their folders kept.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class RehearsalInterrupted(Interrupted):
    """A signal (SIGINT, SIGTERM, SIGHUP) ended the rehearsal; its scratch jobs were ended first."""


@dataclass(frozen=True)
class RehearsalOptions:
    interruptions: int = 3
    kinds: tuple[str, ...] = KINDS
    seed: int = 0
    executor: str = "auto"
    overrides: tuple[str, ...] = ()
    keep: bool = False
    member: str | None = None  # the sweep member to rehearse (a sweep spec needs one)
    resize: int | None = None  # a pause, then the continuation on this many ranks (instead of the interruptions)
    with_trackers: bool = False  # mirror the scratch runs to the spec's trackers (off: they are no real runs)


# -- preparing: everything checked before anything is created -------------------------------------------------
def prepare(spec_file: str | os.PathLike[str], options: RehearsalOptions) -> Rehearsal:
    """Check the spec (with ``options.overrides``; a sweep's ``options.member``), the kinds, the count and
    the executor; create nothing."""
    if options.interruptions < 1:
        raise UsageError(f"--interruptions {options.interruptions}: give 1 or more (the default is 3)")
    unknown = [kind for kind in options.kinds if kind not in KINDS]
    if unknown or not options.kinds:
        raise UsageError(f"--kinds {','.join(options.kinds)!s}: {'unknown kind ' + repr(unknown[0]) if unknown else 'empty'};"
                         f" give a comma-separated list of {', '.join(KINDS)}")
    source = Path(spec_file)
    if options.member is not None or wants_sweep(source, options.overrides):
        spec, folder = _sweep_member(source, options)
    else:
        spec = load_spec_with(source, options.overrides)
        folder = Path(f"{spec.run_dir}.rehearsal")
    if not options.with_trackers:  # scratch runs: the user's trackers hold real runs only
        spec = spec.model_copy(update={"tracking": TrackingSettings()})
    resume_sets = () if options.resize is None else _resize_sets(spec, options.resize)
    continuation = _continuation(source, spec, resume_sets) if resume_sets else None
    executor = executors.choose_executor(options.executor)
    executors.check_executor(spec, executor)
    if continuation is not None:
        try:
            executors.check_executor(continuation, executor)
        except executors.ExecutorError as error:
            raise executors.ExecutorError(f"--resize {options.resize}: the continuation ({' '.join(resume_sets)}) "
                                          f"cannot run: {error}; or rehearse another --resize") from None
    _check_reusable(folder)
    return Rehearsal(source, spec, replace(options, executor=executor), folder, resume_sets)


def _resize_sets(spec: JobSpec, ranks: int) -> tuple[str, ...]:
    """The ``--set``s of ``elfes resume`` that continue ``spec``'s run on ``ranks`` ranks."""
    nodes, world = spec.resources.nodes, spec.world_size
    if ranks < 1 or ranks == world or ranks % nodes:
        why = ("give the number of ranks to continue on, 1 or more" if ranks < 1 else
               f"the job already runs on {world} rank{'' if world == 1 else 's'}; give another world size"
               if ranks == world else
               f"the job runs on {nodes} nodes, so the ranks to continue on must be a multiple of {nodes}")
        raise UsageError(f"--resize {ranks}: {why}")
    per_node = ranks // nodes
    gpus = (f"resources.gpus_per_node={per_node}",) if spec.resources.gpus_per_node else ()
    return (f"resources.tasks_per_node={per_node}", *gpus)


def _continuation(source: Path, spec: JobSpec, resume_sets: tuple[str, ...]) -> JobSpec:
    """The spec ``elfes resume --set`` (``resume_sets``) gives the interrupted run's continuation: the rehearsed
    ``spec``, as its scratch run records it, changed; validated (SpecError naming the field)."""
    overrides = parse_overrides(resume_sets)
    return validate_spec_data(apply_overrides(yaml.safe_load(spec.to_yaml()), overrides),
                              source=describe_source(source, overrides), base=source.absolute().parent)


def _sweep_member(source: Path, options: RehearsalOptions) -> tuple[JobSpec, Path]:
    """The spec of the sweep member ``options.member`` and its rehearsal folder; a rehearsal runs one job,
    never the sweep's base spec."""
    if not wants_sweep(source, options.overrides):
        raise UsageError(f"--member {options.member}: {source} has no sweep section, so it has no members; "
                         "leave out --member")
    plan = plan_sweep(source, sets=options.overrides)
    names = [member.name for member in plan.members]
    listed = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    if options.member is None:
        raise UsageError(f"{source} is a sweep of {len(names)} members ({listed}); a rehearsal runs one job: name "
                         f"the member to rehearse, e.g. --member {shlex.quote(names[0])}")
    chosen = next((member for member in plan.members if member.name == options.member), None)
    if chosen is None:
        raise UsageError(f"--member {options.member}: {source} has no such member; its members are {listed}; "
                         f"give one of them, e.g. --member {shlex.quote(names[0])}")
    return chosen.spec, Path(f"{plan.sweep_dir}.rehearsal") / chosen.name


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
            raise run_state.NotNow(f"{paths.run_dir}: a job of an earlier rehearsal is still alive; "
                                       f"`elfes cancel {paths.run_dir}` it first")


# -- running --------------------------------------------------------------------------------------------------
@dataclass
class Rehearsal:
    source: Path
    spec: JobSpec
    options: RehearsalOptions
    folder: Path
    resume_sets: tuple[str, ...] = ()  # --resize: what the continuation changes (elfes resume --set)

    def run(self, say: Callable[[str], None] = print, show: Show | None = None) -> Report:
        """Run straight-1 and straight-2, then (when they agree) the interrupted run; compare, write the
        report; return it. ``show(run, step, total)`` is called at every look at a run. SIGINT, SIGTERM
        and SIGHUP end every scratch job, keep the folders and raise :class:`RehearsalInterrupted`."""
        for name in RUN_NAMES:
            self._remove(name)
        self.folder.mkdir(parents=True, exist_ok=True)
        runs = ScratchRuns(self.spec, self.options.executor, self.folder, say, show)
        say(f"rehearsal of {self.source} in {self.folder} ({self.options.executor}, seed {self.options.seed})")
        with _ending_signals_raise():
            try:
                report = self._rehearse(runs, say)
            except BaseException as error:
                signum = (error.signum if isinstance(error, Interrupted) else
                          signal.SIGINT if isinstance(error, KeyboardInterrupt) else None)
                # The clean-up is not cut short in turn.
                held = {signum: _set_handler(signum, signal.SIG_IGN) for signum in (signal.SIGINT, *ENDING_SIGNALS)}
                try:
                    ended = runs.end_live_runs()
                finally:
                    for held_signum, handler in held.items():
                        if handler is not None:
                            _set_handler(held_signum, handler)
                if signum is None:
                    raise
                jobs = f"ended the scratch job of {', '.join(ended)}" if ended else "no scratch job was alive"
                raise RehearsalInterrupted(signum, f"{jobs}; the scratch runs are kept in {self.folder}") from None
        write_text_atomically(self.folder / REPORT_FILE, json.dumps(report.to_json(), indent=2, default=str) + "\n")
        if report.verdict == "exact" and not self.options.keep:
            for name in RUN_NAMES:
                self._remove(name)
        return report

    def _rehearse(self, runs: ScratchRuns, say: Callable[[str], None]) -> Report:
        straight_1 = runs.straight("straight-1", None)
        length = measure_length(straight_1)
        straight_2 = runs.straight("straight-2", length)
        say("comparing straight-2 with straight-1 (every tensor's bits with torch.equal, the logged metrics step "
            "by step)")
        raw = compare_runs(straight_2, straight_1, ours_name="straight-2")
        if not raw.compared_files and not raw.metrics_compared:
            raise RehearsalFailed(f"{straight_1} left nothing to compare: no final checkpoint, no exported model and "
                                  "no records; checkpoint with the engine (Trainer.train(checkpoint_dir=job."
                                  "checkpoint_dir)) and rehearse again")
        unused = unused_generators(raw)
        straight = raw.without_generators(unused)
        notes = [generator_note(generator) for generator in unused]
        if not raw.metrics_compared:
            notes.append("The logged metrics were not compared: the job keeps no records (events.jsonl, written by "
                         "RunLogger); the verdict rests on the final checkpoint and the exported files.")
        interruptions: list[Interruption] = []
        retried: list[dict[str, Any]] = []
        resumed: Comparison | None = None
        resized: Resized | None = None
        records: list[dict[str, Any]] = []  # the interrupted run's
        if straight.identical:
            interruptions, retried = self._interrupt(runs, length, say)
            say("comparing the interrupted run with straight-1")
            resumed = compare_runs(self.folder / "interrupted", straight_1).without_generators(unused)
            records = read_records(self.folder / "interrupted")
            if self.options.resize is not None:  # the entries that describe the ranks differ by design
                resumed = resumed.without_per_rank_entries()
                resized = judge_resized(resumed, records, read_records(straight_1), ranks=self.options.resize,
                                        resumed_at=interruptions[0].saved_step)
        else:
            say("the straight runs differ: resume cannot be judged, so the interrupted run is skipped")
        verdict = decide_verdict(straight, resumed, resized)
        notes += runs.environment_notes()
        report = Report(verdict, str(self.source), str(self.folder), self.options.seed, self.options.executor,
                        interruptions, straight, resumed, requested=[p.kind for p in self._plan(length, 0)],
                        kinds=KINDS, retried=retried, notes=notes, runs=runs.runs, resized=resized)
        if verdict == "not resumable" and resized is not None:
            report.likely_causes = resize_causes(resized, records)
        elif verdict == "not resumable" and resumed is not None:
            report.likely_causes = likely_causes(self.spec, resumed, interruptions, records)
        elif verdict == "not reproducible":
            report.advice = reproducibility_advice(self.spec, straight)
        return report

    def _plan(self, length: RunLength, retry: int) -> list[PlannedInterruption]:
        steps = candidate_steps(length.final_step, retry)
        if self.options.resize is not None:  # one pause, then the continuation on the new world size
            return plan_interruptions(1, ("stop",), steps, self.options.seed)
        return plan_interruptions(self.options.interruptions, self.options.kinds, steps, self.options.seed)

    def _interrupt(self, runs: ScratchRuns, length: RunLength,
                   say: Callable[[str], None]) -> tuple[list[Interruption], list[dict[str, Any]]]:
        """The interrupted run; run again with earlier moments while an interruption missed (at most
        :data:`PASSES` in all). Its interruptions, and those that missed in earlier passes."""
        retried: list[dict[str, Any]] = []
        for number in range(PASSES):
            if number:
                self._remove("interrupted")
            done = InterruptedRun(runs, length, self.resume_sets).run(self._plan(length, number))
            missed = [interruption for interruption in done if not interruption.landed]
            earlier = candidate_steps(length.final_step, number + 1) != candidate_steps(length.final_step, number)
            if not missed or number == PASSES - 1 or not earlier:
                break
            retried += [{"pass": number + 1, **interruption.to_json()} for interruption in missed]
            say(f"{len(missed)} of {len(done)} interruptions did not land mid-run "
                f"({', '.join(i.kind for i in missed)}); running the interrupted run again with earlier moments "
                f"(pass {number + 2} of at most {PASSES})")
        if not any(interruption.landed for interruption in done):
            raise RehearsalFailed(f"the interrupted run of {self.source} finished before any interruption "
                                  "landed ahead of its last update, so no resume was tried; give it a "
                                  "longer budget (--set config.epochs=...)")
        return done, retried

    def _remove(self, name: str) -> None:
        """Remove scratch run ``name`` once its job is gone: a local job's controller writes its result and log into
        the run directory after the run recorded its end, and would leave a stray folder behind a removal."""
        remove_run_dir(self.folder / name)
        (self.folder / f"{name}.yaml").unlink(missing_ok=True)


@contextmanager
def _ending_signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Interrupted` (as Ctrl-C raises KeyboardInterrupt) while the
    rehearsal runs; the previous handlers come back after. A no-op off the main thread."""
    def raise_interrupted(signum: int, frame: object) -> None:
        raise Interrupted(signum, "the rehearsal is ending its scratch jobs")

    previous = {signum: _set_handler(signum, raise_interrupted) for signum in ENDING_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                _set_handler(signum, handler)


def _set_handler(signum: int, handler: Any) -> Any:
    try:
        return signal.signal(signum, handler)
    except ValueError:  # not the main thread
        return None


__all__ = ["KINDS", "VERDICTS", "Interruption", "PlannedInterruption", "RehearsalFailed", "RehearsalInterrupted",
           "RehearsalOptions", "Report", "after_the_last_update", "candidate_steps", "plan_interruptions", "prepare"]
