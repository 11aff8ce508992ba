"""The ``elfes`` command line: argparse and printing only; the verbs live in launcher/actions.py.

Login-node commands never import torch (nor numpy): ``--help``, ``validate``, ``status``, ``logs``,
``schema``, ``init`` and ``submit --dry-run`` are tested for it in a subprocess; ``plot`` imports matplotlib
(and numpy) only when it draws, never torch. Tests call
:func:`main` directly: ``main(["status", run_dir, "--json"])`` returns the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import elfes

from .cli_rehearse import DESCRIPTION as REHEARSE_DESCRIPTION
from .cli_rehearse import EXIT_CODES as REHEARSE_EXIT_CODES
from .cli_rehearse import add_arguments as add_rehearse_arguments
from .cli_sweep import add_submit_arguments as add_sweep_arguments

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_NOT_NOW = 3
EXIT_RUN_FAILED = 4
EXIT_RUN_STOPPED = 5
EXIT_INTERRUPTED = 130

EXIT_CODES = f"""\
exit codes:
  {EXIT_OK}    success; with --follow: the run finished
  1    an internal error (a bug: the traceback is printed)
  {EXIT_BAD_INPUT}    bad input: a malformed job spec, bad arguments, not a run directory, a run directory
       holding a different job; nothing was created
  {EXIT_NOT_NOW}    cannot be done now: SLURM is absent or refused the job (the run directory is left as it
       was), the run is busy, finished (raise its budget) or not resumable, no live task to signal
  {EXIT_RUN_FAILED}    --follow: the run ended failed; rehearse: a run failed or timed out (no verdict)
  {EXIT_RUN_STOPPED}    --follow: the run ended stopped or cancelled (`elfes resume` continues it)
{REHEARSE_EXIT_CODES}  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); a submission was completed or undone first; --follow: the job
       keeps running
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elfes",
        description="ELFES: training jobs that survive preemption bitwise-exactly. "
        "One YAML file describes a job; `elfes submit` runs it on SLURM or on this machine.",
        epilog=EXIT_CODES + "\nStart with: elfes init local-debug job.yaml; elfes submit job.yaml --follow",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"elfes {elfes.__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)

    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        return verbs.add_parser(name, help=help_text, description=help_text, epilog=EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)

    def set_option(sub: argparse.ArgumentParser, what: str) -> None:
        sub.add_argument("--set", metavar="KEY=VALUE", dest="sets", action="append", default=[],
                         help=f"change a field of {what}, repeatable: a dotted path and a YAML scalar, e.g. "
                         "--set config.epochs=40 --set slurm.partition=long (config, env and slurm.additional take "
                         "new keys)")

    submit = verb("submit", "Validate a job spec, create its run directory and submit the job.")
    submit.add_argument("spec", metavar="JOB.yaml", help="the job spec")
    submit.add_argument("--executor", choices=("auto", "slurm", "local"), default="auto",
                        help="auto (default): slurm where sbatch is on PATH and a SLURM cluster is configured, "
                        "local otherwise")
    set_option(submit, "the spec")
    submit.add_argument("--dry-run", action="store_true",
                        help="print the sbatch script (slurm) or the local command, touching nothing")
    submit.add_argument("--follow", action="store_true",
                        help="show the job live until it ends; the exit code tells how it ended")
    add_sweep_arguments(submit)

    status = verb("status", "Show where runs stand (from their state files and run records).")
    status.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="run directories or sweep folders")
    status.add_argument("--json", action="store_true",
                        help="print JSON: an object per run with a top-level `status` (a list for several runs)")

    logs = verb("logs", "Print a job's stdout and stderr (latest attempt, rank 0 by default).")
    logs.add_argument("run_dir", metavar="RUN_DIR")
    logs.add_argument("--rank", type=int, default=0, help="the rank whose logs to show (default 0)")
    logs.add_argument("--attempt", type=int, default=None, help="the attempt (default: the latest)")
    logs.add_argument("--follow", action="store_true", help="keep printing new output until the run ends")

    plot = verb("plot", "Draw runs' loss and metrics against the step, their stops, requeues, resumes and kills marked.")
    plot.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="run directories, overlaid by run name")
    plot.add_argument("-o", "--output", metavar="FILE", default=None,
                      help="FILE.png or FILE.svg (default: RUN_DIR/plot.png; needed for several runs); drawing "
                      "needs matplotlib: pip install 'elfes[plot]'")
    plot.add_argument("--metric", metavar="NAME", action="append", default=[],
                      help="a metric to draw, repeatable (default: train/loss and every eval/<loader>/<metric>)")

    preempt = verb("preempt", "Rehearse a preemption: the job saves `last`, is requeued and resumes.")
    preempt.add_argument("run_dir", metavar="RUN_DIR")

    cancel = verb("cancel", "Stop a run for good: it saves `last` and ends cancelled.")
    cancel.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, or a sweep folder (every live member)")

    resume = verb("resume", "Submit a stopped, cancelled or failed run again; it continues from `last`. "
                  "A finished run continues with a raised budget (--set config.epochs=N).")
    resume.add_argument("run_dir", metavar="RUN_DIR",
                        help="a run directory, or a sweep folder (only its members that are not finished)")
    resume.add_argument("--executor", choices=("auto", "slurm", "local"), default=None,
                        help="where to run it (default: the executor of its last submission)")
    set_option(resume, "the recorded spec (the budget, resources, SLURM options, requeue cap, env; not what "
               "changes the math once the run has checkpoints)")
    resume.add_argument("--follow", action="store_true", help="show the job live until it ends")

    validate = verb("validate", "Check a job spec without submitting it; creates nothing.")
    validate.add_argument("spec", metavar="JOB.yaml")
    set_option(validate, "the spec")
    validate.add_argument("--executor", choices=("auto", "slurm", "local"), default="auto",
                          help="also check that this executor can run it (default: the one submit would use)")

    init = verb("init", "Write a job spec template to start from.")
    init.add_argument("template", metavar="TEMPLATE", nargs="?", default="local-debug",
                      help="local-debug (default), slurm-gpu, slurm-node or slurm-multinode")
    init.add_argument("path", metavar="PATH", nargs="?", default="job.yaml", help="where to write it (job.yaml)")

    rehearse = verb("rehearse", "Prove that a job resumes bitwise: two straight runs and one interrupted, compared.")
    rehearse.description = REHEARSE_DESCRIPTION
    add_rehearse_arguments(rehearse)
    set_option(rehearse, "the spec for the rehearsal, typically a shorter budget (--set config.epochs=2)")

    verb("schema", "Print the JSON Schema of a job spec (for editors).")

    doctor = verb("doctor", "Tell what this SLURM cluster does to a job on preemption, time limit and cancel "
                  "(from scontrol), and what to change.")
    doctor.add_argument("spec", metavar="JOB.yaml", nargs="?", default=None,
                        help="the job spec (default: any job of the default partition)")
    doctor.add_argument("--test-job", action="store_true",
                        help="submit a one-minute job that checks that scontrol works from inside a job")
    doctor.add_argument("--json", action="store_true", help="print JSON: the settings read and the findings")
    return parser


def _print(text: str = "") -> None:
    print(text, flush=True)


def _error(message: str) -> None:
    print(f"elfes: error: {message}", file=sys.stderr, flush=True)


# -- the verbs --------------------------------------------------------------------------------------------------
def _submit(args: argparse.Namespace) -> int:
    from . import actions

    result = actions.submit(args.spec, executor=args.executor, dry_run=args.dry_run, sets=args.sets)
    if result.dry_run is not None:
        sys.stdout.write(result.dry_run)
        sys.stdout.flush()
        return EXIT_OK
    verb = "continues" if result.continued else "submitted"
    _print(f"{result.name}: {verb} as {result.executor} job {result.job_id}{_submission_note(result)}")
    _print(f"run directory: {result.run_dir}")
    if args.follow:
        from .cli_follow import follow

        return follow(result.run_dir, from_start=not result.continued)
    _print(f"follow it: elfes status {result.run_dir}   (or elfes logs {result.run_dir} --follow)")
    return EXIT_OK


def _resume(args: argparse.Namespace) -> int:
    from . import actions

    result = actions.resume(args.run_dir, executor=args.executor, sets=args.sets)
    _print(f"{result.name}: resumed as {result.executor} job {result.job_id}; it continues from `last`"
           f"{_submission_note(result)}")
    _print(f"run directory: {result.run_dir}")
    if not args.follow:
        return EXIT_OK
    from .cli_follow import follow

    return follow(result.run_dir, from_start=False)


def _submission_note(result: Any) -> str:
    if result.adopted:
        return " (an interrupted submission had started it; no second job was started)"
    if result.changed:
        return f" (recorded spec changed: {', '.join(result.changed)})"
    return ""


def _validate(args: argparse.Namespace) -> int:
    from . import actions

    result = actions.validate(args.spec, executor=args.executor, sets=args.sets)
    spec = result.spec
    what = spec.entrypoint if spec.entrypoint else " ".join(spec.command or ())
    _print(f"{result.source}: valid job {spec.name!r} ({what})")
    _print(f"  {spec.resources.nodes} node(s) x {spec.resources.tasks_per_node} task(s), "
           f"{spec.resources.gpus_per_node} GPU(s) per node; {spec.resources.timeout_min} min per attempt; "
           f"up to {spec.requeue.max_requeues} requeues")
    _print(f"  run directory: {spec.run_dir}")
    _print(f"  executor here: {result.executor}")
    return EXIT_OK


def _schema(args: argparse.Namespace) -> int:
    from . import actions

    _print(json.dumps(actions.schema(), indent=2))
    return EXIT_OK


def _init(args: argparse.Namespace) -> int:
    from . import actions

    path = actions.init(args.template, args.path)
    _print(f"wrote {path} (template {args.template}); edit it, then: elfes validate {path}")
    return EXIT_OK


def _cell(value: Any) -> str:
    from elfes.records.plain import format_number

    return format_number(value)


def _short_checkpoint(result: Any) -> str:
    """``checkpoints/step-...pt`` (relative to the run directory) for the table; the JSON has the full path."""
    if not result.last_checkpoint:
        return "-"
    prefix = result.run_dir.rstrip("/") + "/"
    return result.last_checkpoint.removeprefix(prefix)


def _queue(result: Any) -> str:
    """SLURM's state with its reason: ``PENDING (BeginTime)``."""
    return f"{result.queue_state} ({result.queue_reason})" if result.queue_reason else result.queue_state


def _status(args: argparse.Namespace) -> int:
    from . import actions

    results = actions.status(args.run_dirs)
    if args.json:
        data = [result.to_json() for result in results]
        _print(json.dumps(data[0] if len(data) == 1 else data, indent=2))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=False, width=200)  # a file or pipe: do not cut cells
    table = Table(show_edge=False)
    for column in ("run", "status", "job", "attempts", "requeues", "step", "best", "last checkpoint"):
        table.add_column(column)
    for result in results:
        best = "-" if result.best_metric is None else (
            f"{result.monitor or 'metric'} {_cell(result.best_metric)} @ {_cell(result.best_step)}")
        table.add_row(
            f"{result.name or '?'} ({result.run_dir})",
            result.status + (f" [{_queue(result)}]" if result.queue_state else ""),
            f"{result.executor or '-'} {result.job_id or ''}".strip()
            + (f" (restarts {result.restart_count})" if result.restart_count else ""),
            str(len(result.attempts)),
            f"{result.requeues_used} used, {_cell(result.requeues_left)} left",
            f"{_cell(result.step)}/{_cell(result.planned_steps)}",
            best,
            _short_checkpoint(result),
        )
    console.print(table)
    for result in results:
        if len(results) == 1 and result.attempts:
            attempts = Table(title="attempts", show_edge=False)
            for column in ("#", "launch", "job", "hosts", "started", "ended", "outcome", "signal", "step"):
                attempts.add_column(column)
            for attempt in result.attempts:
                attempts.add_row(
                    str(attempt["number"]), attempt["launch"], attempt["job_id"], ",".join(attempt["hosts"]),
                    attempt["started_at"], attempt["ended_at"] or "-", attempt["outcome"] or "-",
                    attempt["signal"] or "-", _cell(attempt["step"]),
                )
            console.print(attempts)
        if result.error:
            console.print(f"{result.name or result.run_dir}: error: {result.error}", markup=False)
        for note in result.notes:
            console.print(f"{result.name or result.run_dir}: {note}", markup=False)
    return EXIT_OK


def _logs(args: argparse.Namespace) -> int:
    from . import actions

    if args.follow:
        if args.attempt is not None:
            raise actions.UsageError("--follow shows the latest attempt; leave out --attempt")
        shown = None
        for file, text in actions.follow_logs(args.run_dir, rank=args.rank):
            if file != shown:
                _print(f"==> {file} <==")
                shown = file
            sys.stdout.write(text)
            sys.stdout.flush()
        return EXIT_OK
    found = actions.log_files(args.run_dir, rank=args.rank, attempt=args.attempt)
    if not found.files:
        _print(f"no logs yet for rank {args.rank}" + (f" in attempt {found.attempt}" if found.attempt else ""))
        return EXIT_OK
    for file in found.files:
        _print(f"==> {file} <==")
        with open(file, "rb") as stream:  # streamed: a 200 MB log is never held whole
            while chunk := stream.read(1 << 20):
                sys.stdout.buffer.write(chunk)
    sys.stdout.flush()
    return EXIT_OK


def _plot(args: argparse.Namespace) -> int:
    from . import plot

    result = plot.plot(args.run_dirs, output=args.output, metrics=args.metric)
    _print(f"wrote {result.output}: {', '.join(result.metrics)} of {', '.join(run.name for run in result.runs)}")
    return EXIT_OK


def _doctor(args: argparse.Namespace) -> int:
    from . import doctor

    result = doctor.doctor(args.spec, test_job=args.test_job)
    if args.json:
        _print(json.dumps(result.to_json(), indent=2))
        return EXIT_OK
    settings = ", ".join(f"{name}={value}" for name, value in result.settings.items())
    _print(f"{'job ' + repr(result.job) if result.job else 'any job'} in partition {result.partition} ({settings})")
    for finding in result.findings:
        _print(f"[{finding.level}] {finding.topic}: {finding.says}")
        if finding.change:
            _print(f"    change: {finding.change}")
    problems = len(result.problems)
    _print(f"{problems} problem(s)" if problems else "no problems found")
    return EXIT_OK


def _signalled(result: Any, what: str) -> int:
    if result.targets:
        _print(f"{what}: sent {result.signal} to " + "; ".join(result.targets))
    if result.note:
        _print(result.note)
    return EXIT_OK


def _preempt(args: argparse.Namespace) -> int:
    from . import actions

    result = actions.preempt(args.run_dir)
    _signalled(result, "preempt")
    _print(f"the job saves `last` at the next window boundary, is requeued and resumes; watch: elfes status {result.run_dir}")
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    from . import actions

    result = actions.cancel(args.run_dir)
    _signalled(result, "cancel")
    if result.targets:
        _print(f"the job saves `last` and ends cancelled; continue it later with: elfes resume {result.run_dir}")
    return EXIT_OK


def _rehearse(args: argparse.Namespace) -> int:
    from .cli_rehearse import rehearse

    return rehearse(args)


def _sweep_aware(verb: Any) -> Any:
    """The verb, or its sweep form (launcher/cli_sweep.py) for a sweep spec or a sweep folder."""
    from . import cli_sweep

    def run(args: argparse.Namespace) -> int:
        if verb is _submit and cli_sweep.wants_sweep(args):
            return cli_sweep.submit(args)
        if verb is _status and cli_sweep.any_sweep(args.run_dirs):
            return cli_sweep.status(args, _status)
        if verb in (_resume, _cancel) and cli_sweep.any_sweep([args.run_dir]):
            return (cli_sweep.resume if verb is _resume else cli_sweep.cancel)(args)
        return verb(args)

    return run


VERBS = {
    "submit": _sweep_aware(_submit), "status": _sweep_aware(_status), "logs": _logs, "preempt": _preempt,
    "cancel": _sweep_aware(_cancel), "resume": _sweep_aware(_resume), "validate": _validate, "init": _init,
    "schema": _schema, "plot": _plot, "doctor": _doctor, "rehearse": _rehearse,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see ``elfes --help``)."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        from . import actions, executors, handover, spec, state
    except KeyboardInterrupt:
        _error("interrupted (Ctrl-C) before anything was done")
        return EXIT_INTERRUPTED
    try:
        return VERBS[args.verb](args)
    except handover.Interrupted as interrupted:
        _error(str(interrupted))
        return 128 + interrupted.signum
    except KeyboardInterrupt:
        _error("interrupted (Ctrl-C)")
        return EXIT_INTERRUPTED
    except (spec.SpecError, executors.ExecutorError, actions.UsageError) as error:
        _error(str(error))
        return EXIT_BAD_INPUT
    except (executors.SubmissionError, actions.ActionFailed, state.StateError) as error:
        _error(str(error))
        return EXIT_NOT_NOW
    except RuntimeError as error:
        from .rehearsal import RehearsalFailed

        if not isinstance(error, RehearsalFailed):
            raise
        _error(str(error))
        return EXIT_RUN_FAILED
    except BrokenPipeError:
        return EXIT_OK  # `elfes logs RUN | head`


if __name__ == "__main__":
    raise SystemExit(main())
