"""The ``elfes`` command's arguments: every verb, its options and its help text (argparse only)."""

from __future__ import annotations

import argparse
import re
import textwrap

import elfes

from ..backends import CHOICES
from .exit_codes import EXIT_CODES, EXIT_NOT_NOW, EXIT_OK, EXIT_RUN_FAILED, EXIT_RUN_STOPPED
from .rehearse import DESCRIPTION as REHEARSE_DESCRIPTION
from .rehearse import add_arguments as add_rehearse_arguments
from .sweep import add_submit_arguments as add_sweep_arguments

STATUS_WAIT = f"""\
waiting (--wait, --until, --timeout-s), e.g. in a script or a tour:
  elfes status RUN_DIR --until training && elfes preempt RUN_DIR
  elfes status RUN_DIR --until step=40 --timeout-s 600
  elfes status RUN_DIR --wait    # until it ends; then the status table
  It exits {EXIT_OK} once every run reached the point (--until ended: once each finished), {EXIT_RUN_FAILED} when one ended
  failed first, {EXIT_RUN_STOPPED} stopped or cancelled first, {EXIT_NOT_NOW} when --timeout-s ran out or one finished
  without reaching it.

"""

JOB_FIELDS = """\
main(job), the entrypoint, runs in every task; `job` (elfes.launcher.job.runtime.Job) holds:
  job.config          the spec's `config:`, a plain dict
  job.run_dir         the run directory (pathlib.Path); job.checkpoint_dir is RUN_DIR/checkpoints
  job.resume_from     RUN_DIR/checkpoints/last when it exists (after a preemption or requeue), else None
  job.stop            an elfes.engine.StopRequest, already catching SIGTERM, SIGINT and the requeue signal
  job.attempt         this run's starts so far, from 1; job.rank, job.local_rank, job.world_size
  job.name, job.job_id, job.executor
  The torch distributed variables are set: a plain Accelerator() joins every task. Hand the rest to
  Trainer(accelerator, model, optimizer, loader, step).train(config, checkpoint_dir=job.checkpoint_dir,
  resume_from=job.resume_from, stop=job.stop) and return its TrainState; `step(model, batch)` returns
  StepOutput(loss=<mean loss of the batch>, num_samples=<samples in it>, metrics={...}).
  A stop is saved as `last` at the next update boundary and the job requeues; a finished run returns.
  `elfes init` writes a runnable train.py beside the spec that does all this.

"""


# A line's indentation, and its first column where it is a table row ("  2    bad input: ..."): a
# wrapped row continues under its second column.
_ROW_HEAD = re.compile(r" *(?:\S+(?: \S+)*? {2,})?")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions and epilogs as written where they fit the terminal (COLUMNS); a line wider than
    it is wrapped with the lines that continue it, under its text or its table row's second column."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines: list[str] = []
        for line in text.splitlines():
            if lines and _continues(lines[-1], line) and len(indent) + len(lines[-1]) > width:
                lines[-1] += " " + line.strip()
            else:
                lines.append(line)
        filled = "\n".join(_wrapped(line, width, indent) for line in lines)
        return filled + "\n" if text.endswith("\n") else filled


def _hanging(line: str) -> int:
    head = _ROW_HEAD.match(line)  # every part of the pattern is optional: it matches any line
    return head.end() if head is not None else 0


def _continues(previous: str, line: str) -> bool:
    """Whether ``line`` goes on with ``previous``'s text: indented to its text column, no row of its own."""
    lead = len(line) - len(line.lstrip(" "))
    return bool(line.strip()) and lead == _hanging(previous) and _hanging(line) == lead


def _wrapped(line: str, width: int, indent: str) -> str:
    if len(indent) + len(line) <= width:
        return indent + line if line else line
    lead = len(line) - len(line.lstrip(" "))
    return textwrap.fill(line[lead:], width, initial_indent=indent + line[:lead],
                         subsequent_indent=indent + " " * min(_hanging(line), width // 2),
                         break_long_words=False, break_on_hyphens=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elfes",
        description="ELFES: training jobs that survive preemption bitwise-exactly. "
        "One YAML file describes a job; `elfes submit` runs it on SLURM or on this machine.",
        epilog=JOB_FIELDS + EXIT_CODES + "\nStart with: elfes init local-debug job.yaml (writes job.yaml and train.py); "
        "elfes submit job.yaml --follow",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"elfes {elfes.__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)

    def verb(name: str, help_text: str, epilog: str = "") -> argparse.ArgumentParser:
        return verbs.add_parser(name, help=help_text, description=help_text, epilog=epilog + EXIT_CODES,
                                formatter_class=HelpFormatter)

    def set_option(sub: argparse.ArgumentParser, what: str) -> None:
        sub.add_argument("--set", metavar="KEY=VALUE", dest="sets", action="append", default=[],
                         help=f"change a field of {what}, repeatable: a dotted path and a YAML scalar, e.g. "
                         "--set config.epochs=40 --set slurm.partition=long (config, env and slurm.additional take "
                         "new keys)")

    submit = verb("submit", "Validate a job spec, create its run directory and submit the job.")
    submit.add_argument("spec", metavar="JOB.yaml", help="the job spec")
    submit.add_argument("--executor", choices=CHOICES, default="auto",
                        help="auto (default): slurm where sbatch is on PATH and a SLURM cluster is configured, "
                        "local otherwise")
    set_option(submit, "the spec")
    submit.add_argument("--dry-run", action="store_true",
                        help="print the sbatch script (slurm) or the local command, touching nothing")
    submit.add_argument("--follow", action="store_true",
                        help="show the job live until it ends; the exit code tells how it ended")
    add_sweep_arguments(submit)

    status = verb("status", "Show where runs stand (from their state files and run records).", STATUS_WAIT)
    status.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="run directories or sweep folders")
    status.add_argument("--json", action="store_true",
                        help="print JSON: an object per run with a top-level `status` (a list for several runs)")
    status.add_argument("--wait", action="store_true",
                        help="first wait until each run reaches --until (default: ended), then show it; "
                        "reads files only, like status itself")
    status.add_argument("--until", metavar="POINT", default=None,
                        help="with --wait: training (the latest attempt's training loop runs: signals from now "
                        "on stop it at an update boundary, e.g. `elfes preempt`), step=N (the run records "
                        "reached step N) or ended (finished, stopped, failed or cancelled); implies --wait")
    status.add_argument("--timeout-s", metavar="SECONDS", type=float, default=None,
                        help="with --wait: give up after this many seconds (exit 3); default: wait as long as it takes")

    logs = verb("logs", "Print a job's stdout and stderr (latest attempt; the rank that failed, else rank 0, by "
                "default).")
    logs.add_argument("run_dir", metavar="RUN_DIR")
    logs.add_argument("--rank", type=int, default=None,
                      help="the rank whose logs to show (default: the rank whose failure ended the attempt, else 0; with --follow, 0)")
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
    resume.add_argument("--executor", choices=CHOICES, default=None,
                        help="where to run it (default: the executor of its last submission)")
    set_option(resume, "the recorded spec (the budget, resources, SLURM options, requeue cap, env; not what "
               "changes the math once the run has checkpoints)")
    resume.add_argument("--code", choices=("snapshot", "current"), default="snapshot",
                        help="snapshot (default): run the code snapshot the run was submitted with, saying which "
                        "files of workdir changed since; current: take a fresh snapshot of workdir as it is now")
    resume.add_argument("--include-nodes", action="store_true",
                        help="SLURM: allow again the nodes the run excludes after a rank died or hung there "
                        "(requeue.exclude_failed_nodes; elfes status lists them)")
    resume.add_argument("--follow", action="store_true", help="show the job live until it ends")

    validate = verb("validate", "Check a job spec without submitting it; creates nothing.")
    validate.add_argument("spec", metavar="JOB.yaml")
    set_option(validate, "the spec")
    validate.add_argument("--executor", choices=CHOICES, default="auto",
                          help="also check that this executor can run it (default: the one submit would use)")

    init = verb("init", "Write a job spec template to start from.")
    init.add_argument("template", metavar="TEMPLATE", nargs="?", default="local-debug",
                      help="local-debug (default), slurm-gpu, slurm-node or slurm-multinode")
    init.add_argument("path", metavar="PATH", nargs="?", default="job.yaml", help="where to write it (job.yaml)")

    rehearse = verb("rehearse", "Prove that a job resumes bitwise: two straight runs and one interrupted, compared.")
    rehearse.description = REHEARSE_DESCRIPTION
    add_rehearse_arguments(rehearse)
    set_option(rehearse, "the spec for the rehearsal, typically a shorter budget (--set config.epochs=2)")

    export = verb("export", "Write a checkpoint's raw or EMA weights as a plain state dict file, or with --whole the "
                  "whole checkpoint as one file (torch.load-able; needs torch, not a GPU or a cluster; a sharded "
                  "checkpoint folder of any world size too).")
    export.add_argument("source", metavar="CHECKPOINT", help="a checkpoint file or .dcp folder, a pointer (last, best, "
                        "final), or a run directory (its last)")
    export.add_argument("output", metavar="OUT.pt", help="the file to write")
    export.add_argument("--weights", choices=("raw", "ema"), default="raw", help="raw (default) or ema")
    export.add_argument("--whole", action="store_true", help="write the whole checkpoint instead (weights, EMA, "
                        "optimizer state and the rest; a sharded one's shards read whole) as one file that "
                        "torch.load(weights_only=True) reads")

    sync = verb("sync", "Send what a run's experiment trackers (its spec's tracking:) lack, from its run directory's "
                "records: after a tracker was down at the run's end, or any time. Nothing is sent twice.")
    sync.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="run directories or sweep folders (every member)")

    verb("schema", "Print the JSON Schema of a job spec (for editors).")

    doctor = verb("doctor", "Tell what this SLURM cluster does to a job on preemption, time limit and cancel "
                  "(from scontrol), and what to change.")
    doctor.add_argument("spec", metavar="JOB.yaml", nargs="?", default=None,
                        help="the job spec (default: any job of the default partition)")
    set_option(doctor, "the spec")
    doctor.add_argument("--test-job", action="store_true",
                        help="submit a one-minute job that checks that scontrol works from inside a job")
    doctor.add_argument("--json", action="store_true", help="print JSON: the settings read and the findings")
    return parser
