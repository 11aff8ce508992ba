"""The runtime's logging (launcher/job/job_log.py): while job_logging() is entered, the launcher's lines carry a
time and a level, information on stdout and warnings on stderr; the root logger is never touched, and
everything is as it was once the block ends."""

from __future__ import annotations

import logging
import re

from elfes.launcher.job.job_log import job_logging

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


def test_lines_carry_time_and_level_on_the_stream_of_their_level(capsys):
    log = logging.getLogger("elfes.launcher.job.attempt_runner")
    root = logging.getLogger()
    root_handlers, root_level = list(root.handlers), root.level
    launcher = logging.getLogger("elfes.launcher")
    with job_logging():
        log.info("elfes: attempt 2 ended finished")
        log.warning("elfes: warning: a change")
        log.debug("elfes: not shown")
        assert root.handlers == root_handlers and root.level == root_level  # the user's logging is left alone
    out, err = capsys.readouterr()
    assert re.fullmatch(rf"{STAMP} INFO elfes: attempt 2 ended finished\n", out), out
    assert re.fullmatch(rf"{STAMP} WARNING elfes: warning: a change\n", err), err
    assert launcher.handlers == [] and launcher.propagate and launcher.level == logging.NOTSET  # restored
