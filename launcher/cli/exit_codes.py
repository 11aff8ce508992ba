"""The exit codes of every ``elfes`` command, and their text for ``--help``."""

from __future__ import annotations

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_NOT_NOW = 3
EXIT_RUN_FAILED = 4
EXIT_RUN_STOPPED = 5
EXIT_NOT_RESUMABLE = 6
EXIT_NOT_REPRODUCIBLE = 7
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
  {EXIT_NOT_RESUMABLE}    rehearse: not resumable (the straight runs agree, the interrupted one differs)
  {EXIT_NOT_REPRODUCIBLE}    rehearse: not reproducible (the two straight runs differ)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); a submission was completed or undone first; --follow: the job
       keeps running
"""
