"""The errors the launcher raises on purpose, each carrying the exit code of the ``elfes`` command it ends.

Below every floor (any module may import it). A class that derives from :class:`ElfesError` must say its
``exit_code`` (checked when the class is made), so the command line maps an error to its code with
``error.exit_code`` and a new error can never fall through to exit 1; any other exception is a bug, which exits
1 with its traceback. The codes and their meaning for ``elfes --help`` are launcher/cli/exit_codes.py's text.

>>> raise NotNow(f"{run_dir}: a job of this run is still running; wait for it to end or `elfes cancel` it first")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, ClassVar

EXIT_OK = 0
EXIT_BUG = 1  # an exception that is no ElfesError: the traceback is printed
EXIT_BAD_INPUT = 2
EXIT_NOT_NOW = 3
EXIT_RUN_FAILED = 4
EXIT_RUN_STOPPED = 5
EXIT_NOT_RESUMABLE = 6
EXIT_NOT_REPRODUCIBLE = 7
EXIT_RUN_DAMAGED = 8
EXIT_INTERRUPTED = 130  # 128 + SIGINT


class ElfesError(Exception):
    """An error a command raises on purpose; its message says what is wrong and what to do."""

    exit_code: ClassVar[int]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(getattr(cls, "exit_code", None), int):
            raise TypeError(f"{cls.__name__} derives from ElfesError without an exit_code; give it one of "
                            "launcher/errors.py's EXIT_* codes")


class NotNow(ElfesError, ValueError):
    """What cannot be done now: the run is busy, finished, or not where the move starts (state.json's
    transitions refuse with it). The message says what to wait for or do first."""

    exit_code = EXIT_NOT_NOW


class RunDamaged(ElfesError, ValueError):
    """A record of a run or sweep (``state.json``, ``code.json``, ``sweep.json``) that cannot be read, parsed or
    validated: the file, what is wrong, a safe repair. Its own exit code: waiting does not mend it, and a script
    that retries on "not now" must not retry it."""

    exit_code = EXIT_RUN_DAMAGED
