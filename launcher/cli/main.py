"""The ``elfes`` command line: printing only; the arguments are launcher/cli/parser.py's, the verbs live in
launcher/commands/ (one module per verb family) and return data.

Login-node commands never import torch (nor numpy): ``--help``, ``validate``, ``status``, ``logs``,
``schema``, ``init`` and ``submit --dry-run`` are tested for it in a subprocess; ``plot`` imports matplotlib
(and numpy) only when it draws, never torch. Tests call
:func:`main` directly: ``main(["status", run_dir, "--json"])`` returns the exit code.
"""

from __future__ import annotations

import argparse
import codecs
import json
import signal
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import ElfesError
from . import sweep
from .exit_codes import (
    EXIT_INTERRUPTED,
    EXIT_NOT_NOW,
    EXIT_OK,
    EXIT_RUN_DAMAGED,
    EXIT_RUN_FAILED,
    EXIT_RUN_STOPPED,
)
from .output import print_error, print_line, shell_quoted, table_console
from .parser import build_parser
from .status_wait import wait_in_turn


# -- the verbs --------------------------------------------------------------------------------------------------
def _submit(args: argparse.Namespace) -> int:
    if sweep.wants_sweep(args):
        return sweep.submit(args)
    from ..commands import submission

    result = submission.submit(args.spec, executor=args.executor, dry_run=args.dry_run, sets=args.sets)
    if result.dry_run is not None:
        sys.stdout.write(result.dry_run)
        sys.stdout.flush()
        _print_warnings(result, to_error=True)
        return EXIT_OK
    verb = "continues" if result.continued else "submitted"
    print_line(f"{result.name}: {verb} as {result.executor} job {result.job_id}{_submission_note(result)}")
    print_line(f"run directory: {result.run_dir}")
    if result.code:
        print_line(f"code: {result.code}")
    _print_warnings(result)
    if args.follow:
        from .follow import follow

        return follow(result.run_dir, from_start=not result.continued)
    print_line(f"follow it: elfes status {shell_quoted(result.run_dir)}   (or elfes logs {shell_quoted(result.run_dir)} --follow)")
    return EXIT_OK


def _print_warnings(result: Any, *, to_error: bool = False) -> None:
    """The submission's warnings; on stderr beside a dry run's script."""
    for warning in result.warnings:
        if to_error:
            print(f"elfes: warning: {warning}", file=sys.stderr, flush=True)
        else:
            print_line(f"warning: {warning}")


def _resume(args: argparse.Namespace) -> int:
    if sweep.any_sweep([args.run_dir]):
        if args.code != "snapshot":
            from ..rundir.lookup import UsageError

            raise UsageError(f"--code {args.code}: a sweep's members run the one snapshot taken when the sweep was "
                             "submitted; resume a member alone with --code current (elfes resume SWEEP_DIR/MEMBER "
                             "--code current), or submit the sweep again into another run_dir")
        return sweep.resume(args)
    from ..commands import submission

    result = submission.resume(args.run_dir, executor=args.executor, sets=args.sets, code=args.code,
                               include_nodes=args.include_nodes)
    print_line(f"{result.name}: resumed as {result.executor} job {result.job_id}; it continues from `last`"
           f"{_submission_note(result)}")
    if result.code:
        print_line(f"code: {result.code}")
    _print_warnings(result)
    print_line(f"run directory: {result.run_dir}")
    if not args.follow:
        return EXIT_OK
    from .follow import follow

    return follow(result.run_dir, from_start=False)


def _submission_note(result: Any) -> str:
    if result.adopted:
        return " (an interrupted submission had started it; no second job was started)"
    if result.changed:
        return f" (recorded spec changed: {', '.join(result.changed)})"
    return ""


def _validate(args: argparse.Namespace) -> int:
    from ..commands import authoring

    result = authoring.validate(args.spec, executor=args.executor, sets=args.sets)
    spec = result.spec
    what = spec.entrypoint if spec.entrypoint else " ".join(spec.command or ())
    print_line(f"{result.source}: valid job {spec.name!r} ({what})")
    print_line(f"  {spec.resources.nodes} node(s) x {spec.resources.tasks_per_node} task(s), "
           f"{spec.resources.gpus_per_node} GPU(s) per node; {spec.resources.timeout_min} min per attempt; "
           f"up to {spec.requeue.max_requeues} requeues")
    print_line(f"  run directory: {spec.run_dir}")
    print_line(f"  executor here: {result.executor}")
    return EXIT_OK


def _schema(args: argparse.Namespace) -> int:
    from ..commands import authoring

    print_line(json.dumps(authoring.schema(), indent=2))
    return EXIT_OK


def _init(args: argparse.Namespace) -> int:
    from ..commands import authoring

    written = authoring.init(args.template, args.path)
    entrypoint = (f"and {written.entrypoint} (its entrypoint, train:main: a runnable model to replace with yours)"
                  if written.wrote_entrypoint else f"and kept {written.entrypoint}, which its entrypoint train:main names")
    print_line(f"wrote {written.spec} (template {args.template}) {entrypoint}")
    print_line(f"edit them, then: elfes validate {shell_quoted(written.spec)}; elfes submit {shell_quoted(written.spec)} --follow")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    if sweep.any_sweep(args.run_dirs):
        return sweep.status(args, _run_status)
    return _run_status(args)


def _run_status(args: argparse.Namespace) -> int:
    from ..commands import status

    code = EXIT_OK
    if args.wait or args.until is not None or args.timeout_s is not None:
        code = _wait(args)
    results = status.status(args.run_dirs)
    if args.json:
        data = [result.to_json() for result in results]
        print_line(json.dumps(data[0] if len(data) == 1 else data, indent=2))
    else:
        from .status import print_status

        print_status(table_console(), results)
    return code if code != EXIT_OK else _status_exit_code(results)


def _status_exit_code(results: Any) -> int:
    """8 (a damaged run directory) when a run's state.json cannot be read (every run is still shown), else 0."""
    from ..commands.status import UNREADABLE

    return EXIT_RUN_DAMAGED if any(result.status == UNREADABLE for result in results) else EXIT_OK


def _wait(args: argparse.Namespace) -> int:
    """``status --wait``: block until every run reaches ``--until``; the exit code says how that went."""
    from ..commands.status_wait import wait_for
    from ..rundir.lookup import run_paths

    return wait_in_turn(args.run_dirs, until_text=args.until, timeout_s=args.timeout_s, wait=wait_for,
                        outcome=_run_wait_code, waiting_for=str, goes_on="the job keeps running",
                        check=run_paths)  # a path that is no run directory is refused before any wait, not after


def _run_wait_code(until: Any, waited: Any) -> int:
    """A run's exit code for ``status --wait``: reached, OK (at the end: as the run ended); short of it,
    not-now when the time ran out or the run finished first, else as the run ended (failed or stopped)."""
    from ..rundir.state import RunStatus

    ended_code = {RunStatus.FINISHED: EXIT_OK, RunStatus.FAILED: EXIT_RUN_FAILED}.get(waited.status, EXIT_RUN_STOPPED)
    if waited.reached:
        return ended_code if until.kind == "ended" else EXIT_OK
    return EXIT_NOT_NOW if waited.timed_out or waited.status == RunStatus.FINISHED else ended_code


def _logs(args: argparse.Namespace) -> int:
    from ..commands import logs
    from ..rundir.lookup import UsageError

    if args.follow:
        if args.attempt is not None:
            raise UsageError("--follow shows the latest attempt; leave out --attempt")
        shown = None
        for file, text in logs.follow_logs(args.run_dir, rank=args.rank):
            if file != shown:
                print_line(f"==> {file} <==")
                shown = file
            sys.stdout.write(text)
            sys.stdout.flush()
        return EXIT_OK
    found = logs.log_files(args.run_dir, rank=args.rank, attempt=args.attempt)
    if not found.files:
        print_line(f"no logs yet for rank {found.rank}" + (f" in attempt {found.attempt}" if found.attempt else ""))
    for file in found.files:
        print_line(f"==> {file} <==")
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        with open(file, "rb") as stream:  # streamed: a 200 MB log is never held whole
            while chunk := stream.read(1 << 20):
                sys.stdout.write(decoder.decode(chunk))
            sys.stdout.write(decoder.decode(b"", final=True))
    if found.ending:
        print_line(f"elfes: {found.ending}")  # why it ended: the logs alone may not show it (a full disk, a kill)
    sys.stdout.flush()
    return EXIT_OK


def _plot(args: argparse.Namespace) -> int:
    from ..commands import plot

    result = plot.plot(args.run_dirs, output=args.output, metrics=args.metric)
    from elfes.plot import RUN_COLORS  # loaded by the plot already

    names = [run.name for run in result.runs]
    # As the legend: every run while each has a colour of its own, else the first and the last.
    drawn = ", ".join(names) if len(names) <= len(RUN_COLORS) else f"{len(names)} runs, {names[0]} to {names[-1]}"
    print_line(f"wrote {result.output}: {', '.join(result.metrics)} of {drawn}")
    if result.not_drawn:
        print_line(f"not drawn (no run records yet): {', '.join(result.not_drawn)}")
    for note in result.notes:
        print_line(note)
    return EXIT_OK


def _doctor(args: argparse.Namespace) -> int:
    from ..commands import doctor

    result = doctor.doctor(args.spec, test_job=args.test_job, sets=args.sets)
    if args.json:
        print_line(json.dumps(result.to_json(), indent=2))
        return EXIT_OK
    settings = ", ".join(f"{name}={value}" for name, value in result.settings.items())
    print_line(f"{'job ' + repr(result.job) if result.job else 'any job'} in partition {result.partition} ({settings})")
    for finding in result.findings:
        print_line(f"[{finding.level}] {finding.topic}: {finding.says}")
        if finding.change:
            print_line(f"    change: {finding.change}")
    problems = len(result.problems)
    print_line(f"{problems} problem(s)" if problems else "no problems found")
    return EXIT_OK


def _signalled(result: Any, what: str) -> int:
    if result.targets:
        print_line(f"{what}: sent {result.signal} to " + "; ".join(result.targets))
    if result.note:
        print_line(result.note)
    return EXIT_OK


def _preempt(args: argparse.Namespace) -> int:
    from ..commands import signalling

    result = signalling.preempt(args.run_dir)
    _signalled(result, "preempt")
    print_line(f"the job saves `last` at the next window boundary, is requeued and resumes; watch: elfes status {shell_quoted(result.run_dir)}")
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    if sweep.any_sweep([args.run_dir]):
        return sweep.cancel(args)
    from ..commands import signalling

    result = signalling.cancel(args.run_dir)
    _signalled(result, "cancel")
    if result.targets:
        print_line(f"the job saves `last` and ends cancelled; continue it later with: elfes resume {shell_quoted(result.run_dir)}")
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    from ..commands import export

    result = export.export(args.source, args.output, weights=args.weights, whole=args.whole)
    what = "the whole checkpoint" if result.weights is None else f"the {result.weights} weights of"
    print_line(f"exported {what} {result.checkpoint} to {result.output}")
    return EXIT_OK


def _sync(args: argparse.Namespace) -> int:
    from ..commands import sync

    code = EXIT_OK
    for result in sync.sync(args.run_dirs):
        if not result.trackers:
            print_line(f"{result.run_dir}: no trackers (its spec has no tracking: section)")
        for synced in result.synced:
            sent = f"sent {synced.rows} metric value(s)" + (" and the run's lifecycle" if synced.lifecycle else "")
            what = sent if synced.rows or synced.lifecycle else "nothing to send: it has every record"
            print_line(f"{result.run_dir}: {synced.tracker}: {what} (run {synced.run_id})")
        for tracker, problem in sorted(result.problems.items()):
            if tracker in result.busy:  # the problem says who sends and what to do
                print_line(f"{result.run_dir}: {tracker}: not sent: {problem}")
            else:
                print_line(f"{result.run_dir}: {tracker}: not sent ({problem}); the records wait in events.jsonl: "
                           f"elfes sync {shell_quoted(result.run_dir)} again once {tracker} answers")
            code = EXIT_NOT_NOW
    return code


def _rehearse(args: argparse.Namespace) -> int:
    from .rehearse import rehearse

    return rehearse(args)


VERBS = {
    "submit": _submit, "status": _status, "logs": _logs, "preempt": _preempt, "cancel": _cancel,
    "resume": _resume, "validate": _validate, "init": _init, "schema": _schema, "plot": _plot, "doctor": _doctor,
    "rehearse": _rehearse, "export": _export, "sync": _sync,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see ``elfes --help``)."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        return VERBS[args.verb](args)
    except KeyboardInterrupt:
        print_error("interrupted (Ctrl-C)")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK  # `elfes logs RUN | head`
    except ElfesError as error:  # raised on purpose: its message, its exit code; any other error is a bug
        print_error(str(error))
        return error.exit_code


def run() -> None:
    """The ``elfes`` console script: :func:`main`, then exit with its code. A Ctrl-C that comes once the
    verb is done (while the interpreter shuts down) has nothing left to interrupt and is ignored, so the
    exit code is the verb's, never a bare death by SIGINT."""
    try:
        code = main()
    except KeyboardInterrupt:  # on the way out of main, after the verb's own handling
        code = EXIT_INTERRUPTED
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(code)


if __name__ == "__main__":
    run()
