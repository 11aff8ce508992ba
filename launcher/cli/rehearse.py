"""``elfes rehearse``: its arguments, its live lines and its verdict table (printing only; the work is
launcher/commands/rehearsal/pipeline.py's)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from typing import Any

from ..backends import CHOICES
from .exit_codes import EXIT_NOT_REPRODUCIBLE, EXIT_NOT_RESUMABLE, EXIT_OK

EXIT_FOR_VERDICT = {"exact": EXIT_OK, "within rounding": EXIT_OK, "not resumable": EXIT_NOT_RESUMABLE,
                    "not reproducible": EXIT_NOT_REPRODUCIBLE}

DESCRIPTION = (
    "Prove that this job resumes bitwise: run it twice straight and once with interruptions (the requeue "
    "signal, SIGTERM then resume, SIGKILL then resume; run again earlier when one lands after the last update) "
    "in RUN_DIR.rehearsal/, compare the bits of every tensor of the final checkpoint and of either run's exported "
    "models, and the logged metrics, and give a verdict: exact (exit 0), "
    f"not resumable (exit {EXIT_NOT_RESUMABLE}), not reproducible (exit {EXIT_NOT_REPRODUCIBLE}). "
    "With --resize W: one pause, then the continuation on W ranks, judged within rounding (exit 0) when every "
    "update after it read the same data and every tensor is within float rounding of the straight run. "
    "A sweep spec needs --member NAME. The report is also written to RUN_DIR.rehearsal/report.json."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="JOB.yaml", help="the job spec (its run_dir is never touched)")
    parser.add_argument("--interruptions", type=int, default=3, metavar="N",
                        help="how many interruptions, spread over the run (default 3)")
    parser.add_argument("--kinds", default="requeue,stop,kill", metavar="KINDS",
                        help="comma-separated kinds, cycled: requeue, stop, kill (default: all three)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the interruption moments (default 0)")
    parser.add_argument("--executor", choices=CHOICES, default="auto",
                        help="where the three runs go (default: as submit)")
    parser.add_argument("--member", metavar="NAME", dest="members", action="append", default=[],
                        help="a member of a sweep spec to rehearse (a sweep spec needs one; repeatable: each is "
                             "rehearsed in turn)")
    parser.add_argument("--resize", type=int, default=None, metavar="W",
                        help="instead of the interruptions: pause the run, then continue it on W ranks (elfes resume "
                             "--set resources.tasks_per_node=...), and compare it with the straight run within rounding")
    parser.add_argument("--keep", action="store_true", help="keep the scratch runs after an exact verdict")
    parser.add_argument("--with-trackers", action="store_true",
                        help="mirror the scratch runs to the spec's experiment trackers (tracking:) too; by default "
                        "they send nothing there")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def rehearse(args: argparse.Namespace) -> int:
    """Rehearse the spec, or each ``--member`` of a sweep spec in turn (every one checked before any runs);
    the exit code is the first member's that is not exact."""
    from ..commands.rehearsal.pipeline import RehearsalOptions, prepare

    options = RehearsalOptions(
        interruptions=args.interruptions, kinds=tuple(kind.strip() for kind in args.kinds.split(",") if kind.strip()),
        seed=args.seed, executor=args.executor, overrides=tuple(args.sets), keep=args.keep, resize=args.resize,
        with_trackers=args.with_trackers)
    rehearsals = [prepare(args.spec, replace(options, member=member)) for member in args.members or [None]]
    reports = []
    for rehearsal in rehearsals:
        with LiveView(sys.stderr if args.json else sys.stdout, bars=not args.json and sys.stdout.isatty()) as view:
            reports.append(rehearsal.run(view.say, view.show))
        if not args.json:
            _print_verdict(reports[-1])
    if args.json:
        data = [report.to_json() for report in reports]
        print(json.dumps(data[0] if len(data) == 1 else data, indent=2, default=str), flush=True)
    return next((code for code in (EXIT_FOR_VERDICT[report.verdict] for report in reports) if code != EXIT_OK),
                EXIT_OK)


class LiveView:
    """What a rehearsal shows while it runs: its lines (each interruption as it lands), and each run's step
    against its total: a rich bar per run on a terminal, else a line every :attr:`EVERY_S` seconds."""

    EVERY_S = 5.0

    def __init__(self, stream: Any, *, bars: bool) -> None:
        self.stream, self.bars = stream, bars
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}
        self.shown: dict[str, tuple[float, int]] = {}

    def __enter__(self) -> LiveView:
        if self.bars:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("steps"), console=Console(file=self.stream, highlight=False))
            self.progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def say(self, line: str) -> None:
        if self.progress is not None:
            self.progress.console.print(line, markup=False)
        else:
            print(f"elfes: {line}" if self.stream is sys.stderr else line, file=self.stream, flush=True)

    def show(self, run: str, step: int, total: int | None) -> None:
        if self.progress is not None:
            if run not in self.tasks:
                self.tasks[run] = self.progress.add_task(run, total=total)
            self.progress.update(self.tasks[run], completed=step, total=total)
            return
        now = time.monotonic()
        last_time, last_step = self.shown.get(run, (float("-inf"), -1))
        if step != last_step and now - last_time >= self.EVERY_S:
            self.shown[run] = (now, step)
            self.say(f"  {run}: step {step}" + (f"/{total}" if total else ""))


def _print_verdict(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title="interruptions", show_edge=False)
    for column in ("#", "kind", "step", "moment", "attempt", "saved step", "landed"):
        table.add_column(column)
    for number, interruption in enumerate(report.interruptions, start=1):
        table.add_row(str(number), interruption.kind, str(interruption.step), interruption.moment,
                      str(interruption.attempt), "" if interruption.saved_step is None else str(interruption.saved_step),
                      "yes" if interruption.landed else "no")
    console.print(table)
    differences = report.differences
    if report.resized is not None and report.verdict == "within rounding":  # rounding is expected: the line says it
        differences = replace(differences, tensors=(), divergence=None)
    if differences.tensors:
        tensors = Table(title=f"differing tensors ({len(differences.tensors)})", show_edge=False)
        for column in ("file", "tensor", "max abs difference"):
            tensors.add_column(column)
        for difference in differences.tensors[:12]:
            amount = difference.note if difference.max_abs_diff is None else f"{difference.max_abs_diff:.3g}"
            tensors.add_row(difference.file, difference.name, amount)
        console.print(tensors)
    if differences.divergence is not None:
        d = differences.divergence
        console.print(f"first diverging step: {d.step} ({d.event} {d.metric}: {d.ours!r} vs {d.theirs!r})")
    from ..rundir.provenance import Provenance

    recorded = [(name, item) for name, run in report.runs.items() for item in run.get("provenance", ()) if item]
    if recorded:  # the first attempt's; a change in any later one is among the notes
        console.print(f"{recorded[0][0]} ran on {Provenance.from_json(recorded[0][1]).describe()}", markup=False,
                      soft_wrap=True)
    console.print(f"verdict: {report.summary}")
    for line in report.notes:
        console.print(f"  note: {line}")
    for line in report.likely_causes or report.advice:
        console.print(f"  - {line}")
    console.print(f"report: {report.rehearsal_dir}/report.json")
