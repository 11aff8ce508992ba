"""``elfes rehearse``: its arguments, its live lines and its verdict table (printing only; the work is
launcher/commands/rehearsal.py's)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .exit_codes import EXIT_NOT_REPRODUCIBLE, EXIT_NOT_RESUMABLE, EXIT_OK

EXIT_FOR_VERDICT = {"exact": EXIT_OK, "not resumable": EXIT_NOT_RESUMABLE, "not reproducible": EXIT_NOT_REPRODUCIBLE}

DESCRIPTION = (
    "Prove that this job resumes bitwise: run it twice straight and once with interruptions (the requeue "
    "signal, SIGTERM then resume, SIGKILL then resume) in RUN_DIR.rehearsal/, compare every tensor of the "
    "final checkpoint and exported models and the logged metrics, and give a verdict: exact (exit 0), "
    f"not resumable (exit {EXIT_NOT_RESUMABLE}), not reproducible (exit {EXIT_NOT_REPRODUCIBLE}). "
    "The report is also written to RUN_DIR.rehearsal/report.json."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="JOB.yaml", help="the job spec (its run_dir is never touched)")
    parser.add_argument("--interruptions", type=int, default=3, metavar="N",
                        help="how many interruptions, spread over the run (default 3)")
    parser.add_argument("--kinds", default="requeue,stop,kill", metavar="KINDS",
                        help="comma-separated kinds, cycled: requeue, stop, kill (default: all three)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the interruption moments (default 0)")
    parser.add_argument("--executor", choices=("auto", "slurm", "local"), default="auto",
                        help="where the three runs go (default: as submit)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch runs after an exact verdict")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def rehearse(args: argparse.Namespace) -> int:
    from ..commands.rehearsal import RehearsalOptions, prepare

    options = RehearsalOptions(
        interruptions=args.interruptions, kinds=tuple(kind.strip() for kind in args.kinds.split(",") if kind.strip()),
        seed=args.seed, executor=args.executor, overrides=tuple(args.sets), keep=args.keep)
    rehearsal = prepare(args.spec, options)
    say = (lambda line: print(f"elfes: {line}", file=sys.stderr, flush=True)) if args.json else _say
    report = rehearsal.run(say)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str), flush=True)
    else:
        _print_verdict(report)
    return EXIT_FOR_VERDICT[report.verdict]


def _say(line: str) -> None:
    print(line, flush=True)


def _print_verdict(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title="interruptions", show_edge=False)
    for column in ("#", "kind", "step", "moment", "attempt", "saved step"):
        table.add_column(column)
    for number, interruption in enumerate(report.interruptions, start=1):
        table.add_row(str(number), interruption.kind, str(interruption.step), interruption.moment,
                      str(interruption.attempt), "" if interruption.saved_step is None else str(interruption.saved_step))
    console.print(table)
    differences = report.differences
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
    console.print(f"verdict: {report.verdict}")
    for line in report.likely_causes or report.advice:
        console.print(f"  - {line}")
    console.print(f"report: {report.rehearsal_dir}/report.json")
