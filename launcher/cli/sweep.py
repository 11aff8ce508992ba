"""The ``elfes`` command line for sweeps: printing ``submit`` of a sweep, ``status``/``resume``/``cancel``
of a sweep folder. Called by launcher/cli/main.py when the spec has a ``sweep`` (or ``--sweep`` is given) or
a folder holds ``sweep.json``. Torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ..backends import backend_for
from ..rundir.sweep_record import is_sweep_dir
from .output import print_line, shell_quoted, table_console
from .status_wait import wait_in_turn

SWEEP_HELP = ("run a sweep: one member per value (repeatable; several give every combination), e.g. "
              "--sweep config.lr=0.001,0.003 --sweep config.seed=0,1; each member is a run directory under run_dir")


def add_submit_arguments(submit: argparse.ArgumentParser) -> None:
    submit.add_argument("--sweep", metavar="KEY=V1,V2", dest="sweeps", action="append", default=[], help=SWEEP_HELP)
    submit.add_argument("--max-parallel", metavar="N", type=int, default=None,
                        help="a sweep's members running at once (default: the spec's sweep.max_parallel, else all)")


def wants_sweep(args: argparse.Namespace) -> bool:
    from ..spec.sweep import wants_sweep as spec_wants_sweep

    return bool(args.sweeps) or args.max_parallel is not None or spec_wants_sweep(args.spec, args.sets)


def any_sweep(folders: list[str]) -> bool:
    return any(is_sweep_dir(folder) for folder in folders)


def submit(args: argparse.Namespace) -> int:
    from ..commands.sweep import verbs as sweep
    from ..rundir.lookup import UsageError

    if args.follow:
        raise UsageError("--follow shows one run; a sweep has many: leave out --follow and watch it with "
                         "`elfes status SWEEP_DIR` (or follow one member: elfes logs SWEEP_DIR/MEMBER --follow)")
    result = sweep.submit(args.spec, executor=args.executor, dry_run=args.dry_run, sets=args.sets,
                          sweeps=args.sweeps, max_parallel=args.max_parallel)
    if result.dry_run is not None:
        sys.stdout.write(result.dry_run)
        sys.stdout.flush()
        return 0
    how = backend_for(result.executor).jobs_name(result.job_ids)
    print_line(f"{result.name}: sweep of {len(result.members)} member(s), at most {result.max_parallel} at once, as {how}")
    print_line(f"sweep folder: {result.sweep_dir}")
    for warning in result.warnings:
        print_line(f"warning: {warning}")
    print_line(f"follow it: elfes status {shell_quoted(result.sweep_dir)}")
    return _refusals(result)


def _refusals(result: Any) -> int:
    """sbatch refused an array after others were queued: the sweep stays, its other members left for
    `elfes resume SWEEP_DIR` (exit 3)."""
    if not result.refused:
        return 0
    from .exit_codes import EXIT_NOT_NOW
    from .output import print_error

    print_error(f"{result.error}\n{len(result.refused)} member(s) were not handed over (the array(s) queued before "
                f"run): {', '.join(result.refused)}; once the cause is fixed, `elfes resume {result.sweep_dir}` hands "
                "them over")
    return EXIT_NOT_NOW


def resume(args: argparse.Namespace) -> int:
    from ..commands.sweep import verbs as sweep

    result = sweep.resume(args.run_dir, executor=args.executor, sets=args.sets,
                          include_nodes=args.include_nodes)
    if result.members:
        how = backend_for(result.executor).jobs_name(result.job_ids)
        print_line(f"{result.name}: resumed {len(result.members)} member(s) as {how}: {', '.join(result.members)}")
    else:
        print_line(f"{result.name}: no member to resume")
    if result.scheduler_started:
        waiting = sum(why == "waiting" for why in result.skipped.values()) + len(result.members)
        print_line(f"{result.name}: no scheduler was alive; started one for the {waiting} waiting member(s)")
    for name, why in result.skipped.items():
        print_line(f"  left alone: {name} ({why})")
    for note in result.notes:
        print_line(f"note: {note}")
    print_line(f"follow it: elfes status {shell_quoted(result.sweep_dir)}")
    from ..rundir.sweep_status import UNREADABLE
    from .exit_codes import EXIT_RUN_DAMAGED

    # A member whose state.json cannot be read is left alone, and that is a problem to see to.
    unreadable = any(why.startswith(f"{UNREADABLE}:") for why in result.skipped.values())
    return _refusals(result) or (EXIT_RUN_DAMAGED if unreadable else 0)


def cancel(args: argparse.Namespace) -> int:
    from ..commands.sweep import verbs as sweep

    result = sweep.cancel_sweep(args.run_dir)
    for signalled in result.signalled:
        if signalled.targets:
            print_line(f"cancel {signalled.run_dir.name}: sent {signalled.signal} to " + "; ".join(signalled.targets))
        elif signalled.note:
            print_line(f"cancel {signalled.run_dir.name}: {signalled.note}")
    if result.unqueued:
        print_line(f"not started (were waiting for a slot): {', '.join(result.unqueued)}")
    if not result.signalled and not result.unqueued:
        print_line("no live member; nothing to cancel")
    print_line(f"the cancelled members save `last`; continue the unfinished ones with: elfes resume {result.sweep_dir}")
    return 0


def _counts_line(counts: dict[str, int]) -> str:
    parts = [f"{status} {count}" for status, count in counts.items() if status != "total"]
    return f"{counts.get('total', 0)} member(s): " + ", ".join(parts)


def _step(member: Any) -> str:
    """``40/1500``; ``-`` before the member's records name a step (a waiting member)."""
    from .status import progress

    return progress(member)


def _sweep_table(console: Any, result: Any) -> None:
    from rich.table import Table

    from elfes.records.plain import format_number as cell

    table = Table(title=f"sweep {result.name} ({result.sweep_dir}), {result.executor}, at most {result.max_parallel} "
                  "at once", show_edge=False, title_justify="left")
    for column in ("member", "status", "job", "attempts", "requeues", "step", "best", "last checkpoint"):
        table.add_column(column)
    for member in result.members:
        best = "-" if member.best_metric is None else (
            f"{member.monitor or 'metric'} {cell(member.best_metric)} @ {cell(member.best_step)}")
        checkpoint = "-" if not member.last_checkpoint else member.last_checkpoint.removeprefix(member.run_dir + "/")
        table.add_row(member.name, member.status, member.job_id or "-", str(member.attempts), str(member.requeues_used),
                      _step(member), best, checkpoint)
    console.print(table)
    console.print(_counts_line(result.counts), markup=False)
    for name, problem in result.problems.items():
        console.print(f"{name}: not started: {problem}", markup=False)
    from ..rundir.state import RunStatus
    from ..rundir.sweep_status import UNREADABLE

    for member in result.members:
        if member.status == UNREADABLE:
            console.print(f"{member.name}: {UNREADABLE}: {member.error}", markup=False)
        elif member.error and member.status == RunStatus.FAILED:
            console.print(f"{member.name}: error: {member.error}", markup=False)
    if result.stalled:
        console.print(f"sweep {result.name}: {result.stalled}", markup=False)


def _wait_sweeps(args: argparse.Namespace, sweeps: list[str]) -> int:
    """``status SWEEP_DIR --wait/--until``: block until every member of each sweep reaches the point."""
    from ..commands.status_wait import wait_for_sweep

    return wait_in_turn(sweeps, until_text=args.until, timeout_s=args.timeout_s, wait=wait_for_sweep,
                        outcome=_sweep_wait_code, waiting_for=lambda folder: f"every member of {folder}",
                        goes_on="the sweep goes on")


def _sweep_wait_code(until: Any, waited: Any) -> int:
    """A sweep's exit code for ``status --wait``: reached, OK (at the end: failed if a member failed, stopped
    if one stopped, was cancelled or not started); short of it, a damaged run directory when a member
    cannot be read, not-now when the time ran out or the sweep stalled, else failed or stopped as above
    (not-now when every member ended well)."""
    from ..rundir.state import RunStatus
    from ..rundir.sweep_status import NOT_STARTED
    from .exit_codes import EXIT_NOT_NOW, EXIT_OK, EXIT_RUN_DAMAGED, EXIT_RUN_FAILED, EXIT_RUN_STOPPED

    counts = waited.counts
    ended_code = (EXIT_RUN_FAILED if counts.get(RunStatus.FAILED) else
                  EXIT_RUN_STOPPED if any(counts.get(word) for word in (RunStatus.STOPPED, RunStatus.CANCELLED,
                                                                         NOT_STARTED))
                  else EXIT_OK)
    if waited.reached:
        return ended_code if until.kind == "ended" else EXIT_OK
    if waited.unreadable:
        return EXIT_RUN_DAMAGED
    return EXIT_NOT_NOW if (waited.timed_out or waited.stalled) else (
        EXIT_RUN_FAILED if counts.get(RunStatus.FAILED) else EXIT_NOT_NOW if ended_code == EXIT_OK else ended_code)


def status(args: argparse.Namespace, run_status: Callable[[argparse.Namespace], int]) -> int:
    """``elfes status`` of folders among which some are sweeps: a table per sweep, then the runs' table
    (``run_status``, the CLI's own); ``--json``: one object per folder (a list for several). Exit 8 when a
    member's ``state.json`` cannot be read; with ``--wait``/``--until``, how the wait went first."""
    from ..commands import status as status_report
    from ..rundir.sweep_status import UNREADABLE, sweep_status
    from .exit_codes import EXIT_OK, EXIT_RUN_DAMAGED

    sweeps = [folder for folder in args.run_dirs if is_sweep_dir(folder)]
    runs = [folder for folder in args.run_dirs if not is_sweep_dir(folder)]
    waited = EXIT_OK
    if args.wait or args.until is not None or args.timeout_s is not None:
        waited = _wait_sweeps(args, sweeps)
    results = {folder: sweep_status(folder) for folder in sweeps}
    code = waited or (EXIT_RUN_DAMAGED if any(result.counts.get(UNREADABLE) for result in results.values()) else EXIT_OK)
    if args.json:
        found = {folder: result.to_json() for folder, result in results.items()}
        reports = status_report.status(runs)
        found.update((folder, result.to_json()) for folder, result in zip(runs, reports))
        data = [found[folder] for folder in args.run_dirs]
        print_line(json.dumps(data[0] if len(data) == 1 else data, indent=2))
        unreadable = any(report.status == status_report.UNREADABLE for report in reports)
        return code or (EXIT_RUN_DAMAGED if unreadable else EXIT_OK)
    console = table_console()
    for folder in sweeps:
        _sweep_table(console, results[folder])
    if runs:
        return code or run_status(argparse.Namespace(**{**vars(args), "run_dirs": runs}))
    return code
