"""Running one SLURM client command: the only place the launcher starts ``sbatch``, ``squeue``, ``sacct``,
``sacctmgr``, ``scontrol``, ``scancel`` or ``sinfo`` (tests/test_slurm_adapter.py holds every other module to it).

A command that cannot be started (not on PATH) answers with ``code`` None; one that does not answer in time is
killed and answers code 124, saying so on stderr: a slow controller is not a missing program. Torch-free.

>>> answer = run(Tool.SQUEUE, "-h", "-j", "77")  # doctest: +SKIP
>>> answer.ok, answer.said  # doctest: +SKIP
(False, 'slurm_load_jobs error: Invalid job id specified')
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from ..errors import EXIT_NOT_NOW, ElfesError

# A query or a control from a login node: squeue, sacct, sacctmgr, sinfo, scontrol, scancel.
TOOL_TIMEOUT_S = 30
# A command a job runs on itself (scontrol requeue/update, scancel, sinfo): its controller may be busy with
# the very preemption that made the job call it.
IN_JOB_TIMEOUT_S = 60
# `scontrol ping`, asked only to tell whether a configless cluster answers here.
PING_TIMEOUT_S = 15
# The exit code of a command killed for not answering in time (timeout(1)'s).
TIMED_OUT_CODE = 124


class Tool(str, Enum):
    """SLURM's client commands that ELFES runs itself (submitit runs its own sbatch for submissions)."""

    SBATCH = "sbatch"
    SQUEUE = "squeue"
    SACCT = "sacct"
    SACCTMGR = "sacctmgr"
    SCONTROL = "scontrol"
    SCANCEL = "scancel"
    SINFO = "sinfo"


@dataclass(frozen=True)
class Answer:
    """What one SLURM command answered. ``code`` is None when it could not be started (``error`` says why, in
    the operating system's words); 124 (with ``timed_out``) when it was killed for not answering in time."""

    argv: tuple[str, ...]
    code: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # why it could not run or did not answer: the OSError or TimeoutExpired text
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def started(self) -> bool:
        return self.code is not None

    @property
    def said(self) -> str:
        """Its message: stderr, else stdout, stripped."""
        return (self.stderr or self.stdout).strip()

    @property
    def command(self) -> str:
        """The command line as a user would type it: ``scancel --signal=USR2 77``."""
        return " ".join(self.argv)

    def lines(self) -> list[str]:
        """The non-empty lines of stdout, stripped, in order, each once."""
        return list(dict.fromkeys(line.strip() for line in self.stdout.splitlines() if line.strip()))


def _ignore_stop_signals() -> None:
    # preexec_fn of a command a job runs on itself: scontrol must outlive the SIGTERM that its own requeue makes
    # SLURM send to every process of the job (it is one of them); killed before it exits, it reports nothing
    # although the job is requeued. SIGKILL, KillWait later, still ends it.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def run(tool: Tool, *arguments: str, timeout_s: float = TOOL_TIMEOUT_S, in_job: bool = False,
        environment: Mapping[str, str] | None = None) -> Answer:
    """Run ``tool arguments...`` for at most ``timeout_s``, its output captured as text. ``in_job``: the job runs
    it on itself, and it ignores the stop signals SLURM sends the job meanwhile. ``environment``: variables set for
    it over this process's (how sacct prints its times, say)."""
    argv = (tool.value, *arguments)
    preexec: Callable[[], None] | None = _ignore_stop_signals if in_job else None
    env = {**os.environ, **environment} if environment is not None else None
    try:
        completed = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False,
                                   preexec_fn=preexec, env=env)
    except subprocess.TimeoutExpired as error:
        return Answer(argv, TIMED_OUT_CODE, "", f"{tool.value} did not answer within {timeout_s:g} s", str(error),
                      timed_out=True)
    except (OSError, subprocess.SubprocessError) as error:
        return Answer(argv, None, error=str(error))
    return Answer(argv, completed.returncode, completed.stdout, completed.stderr)


class SlurmError(ElfesError, RuntimeError):
    """A SLURM command that a caller needs did not answer: not on PATH, refused, or too slow (``answer``)."""

    exit_code = EXIT_NOT_NOW

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        super().__init__(f"{answer.command} failed: {answer.error or answer.said or answer.code}")


def answered(answer: Answer) -> Answer:
    """``answer`` when the command succeeded; else raises :class:`SlurmError`."""
    if not answer.ok:
        raise SlurmError(answer)
    return answer
