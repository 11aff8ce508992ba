"""How the in-job runtime writes its own lines in the rank's logs: through :mod:`logging`, with a time and a level.

Every module of the launcher logs to a logger of its own (``logging.getLogger(__name__)``); :func:`job_logging`,
entered once by the runtime in the job process (launcher/job/runtime.py), gives the ``elfes.launcher`` loggers
one handler: INFO lines go to standard output and WARNING and above to standard error, the streams that the
rank's ``logs/attempt-<A>/rank-<R>.out|err`` receive, each line as
``2026-12-05 14:03:07,512 INFO elfes: attempt 2 ...``: the level is the format's, so a message never says it
(``log.warning("elfes: warning: ...")`` would print it twice; tests/launcher/test_job_log.py finds one). The root
logger, and so the logging of the user's code, is left alone. Torch-free.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from ..rundir.task_files import LOG_LINE_FORMAT

LAUNCHER_LOGGER = "elfes.launcher"


class _StandardStreams(logging.Handler):
    """INFO to ``sys.stdout``, WARNING and above to ``sys.stderr``, looked up at each line (so that a swapped
    stream is followed), flushed at once (a task may leave through ``os._exit``)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def job_logging() -> Iterator[None]:
    """While the block runs, the launcher's lines carry a time and a level and go to the standard streams.
    Whoever runs the job (the runtime, once per task), never library code; restores the logger on exit."""
    logger = logging.getLogger(LAUNCHER_LOGGER)
    saved = logger.level, logger.propagate
    handler = _StandardStreams()
    handler.setFormatter(logging.Formatter(LOG_LINE_FORMAT))
    logger.addHandler(handler)
    # Not propagated: a root logger that the user's code configures would write every line twice.
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
