"""The exit codes of every ``elfes`` command, and their text for ``--help``."""

from __future__ import annotations

from ..errors import (  # the codes live with the errors that carry them
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_NOT_NOW,
    EXIT_NOT_REPRODUCIBLE,
    EXIT_NOT_RESUMABLE,
    EXIT_OK,
    EXIT_RUN_DAMAGED,
    EXIT_RUN_FAILED,
    EXIT_RUN_STOPPED,
)

__all__ = ["EXIT_BAD_INPUT", "EXIT_CODES", "EXIT_INTERRUPTED", "EXIT_NOT_NOW", "EXIT_NOT_REPRODUCIBLE",
           "EXIT_NOT_RESUMABLE", "EXIT_OK", "EXIT_RUN_DAMAGED", "EXIT_RUN_FAILED", "EXIT_RUN_STOPPED"]

EXIT_CODES = f"""\
exit codes:
  {EXIT_OK}    success; with --follow: the run finished
  1    an internal error (a bug: the traceback is printed)
  {EXIT_BAD_INPUT}    bad input: a malformed job spec, bad arguments, not a run directory, a run directory
       holding a different job; nothing was created
  {EXIT_NOT_NOW}    cannot be done now: SLURM is absent or refused the job (the run directory is left as it
       was), the run is busy, finished (raise its budget) or not resumable, no live task to
       signal, a tracker that took nothing (sync)
  {EXIT_RUN_FAILED}    --follow: the run ended failed; rehearse: a run failed or timed out (no verdict)
  {EXIT_RUN_STOPPED}    --follow: the run ended stopped or cancelled (`elfes resume` continues it)
  {EXIT_NOT_RESUMABLE}    rehearse: not resumable (the straight runs agree, the interrupted one differs)
  {EXIT_NOT_REPRODUCIBLE}    rehearse: not reproducible (the two straight runs differ)
  {EXIT_RUN_DAMAGED}    a damaged run directory: a record elfes wrote (state.json, code.json, sweep.json) cannot
       be read; the message names the file and the repair (other runs are still shown)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); a submission was completed or undone first; --follow: the job
       keeps running
"""
