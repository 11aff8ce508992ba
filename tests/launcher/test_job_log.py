"""The runtime's logging (launcher/job/job_log.py): while job_logging() is entered, the launcher's lines carry a
time and a level, information on stdout and warnings on stderr; the root logger is never touched, and
everything is as it was once the block ends. The level is printed once: no launcher line says it again."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

from elfes.launcher.job.job_log import job_logging

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"
LEVEL_WORDS = ("debug", "info", "warning", "error", "critical")
LOGGING_METHODS = (*LEVEL_WORDS, "exception", "log")


def test_lines_carry_time_and_level_on_the_stream_of_their_level(capsys):
    log = logging.getLogger("elfes.launcher.job.attempt_runner")
    root = logging.getLogger()
    root_handlers, root_level = list(root.handlers), root.level
    launcher = logging.getLogger("elfes.launcher")
    with job_logging():
        log.info("elfes: attempt 2 ended finished")
        log.warning("elfes: a change")
        log.debug("elfes: not shown")
        assert root.handlers == root_handlers and root.level == root_level  # the user's logging is left alone
    out, err = capsys.readouterr()
    assert re.fullmatch(rf"{STAMP} INFO elfes: attempt 2 ended finished\n", out), out
    assert re.fullmatch(rf"{STAMP} WARNING elfes: a change\n", err), err
    assert launcher.handlers == [] and launcher.propagate and launcher.level == logging.NOTSET  # restored


def _leading_text(node: ast.expr) -> str:
    """The text a message starts with: a string's, or an f-string's up to its first value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return ""


def levels_said_again(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, message) for each logging call (``log.warning(...)``, or command.py's ``_say``, a warning) whose
    message starts with a level word (``elfes: warning: ...``), which job_logging's format prints already."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        logs = (isinstance(func, ast.Attribute) and func.attr in LOGGING_METHODS and isinstance(func.value, ast.Name)
                and func.value.id in ("log", "logger", "logging")) or (isinstance(func, ast.Name) and func.id == "_say")
        message = node.args[1] if isinstance(func, ast.Attribute) and func.attr == "log" and len(node.args) > 1 else node.args[0]
        text = _leading_text(message).removeprefix("elfes: ")
        if logs and text.partition(":")[0].strip().lower() in LEVEL_WORDS:
            found.append((node.lineno, text))
    return found


def test_no_launcher_line_says_its_level_again():
    """`log.warning(f"elfes: warning: ...")` printed `WARNING elfes: warning: ...`. (The engine's loggers,
    elfes.records.*, get no format from job_logging: Python's last resort prints their message alone, so theirs
    says `elfes: warning:` once.)"""
    said = [f"{file.relative_to(LAUNCHER.parent)}:{line}: {text!r}" for file in sorted(LAUNCHER.rglob("*.py"))
            for line, text in levels_said_again(ast.parse(file.read_text(encoding="utf-8")))]
    assert said == [], "the level is job_logging's; say the message alone:\n" + "\n".join(said)


def test_the_scan_finds_a_level_said_again():
    source = 'log.warning(f"elfes: warning: {x} failed")\nlog.info("elfes: attempt 2")\n_say(f"warning: {note}")\n'
    assert levels_said_again(ast.parse(source)) == [(1, "warning: "), (3, "warning: ")]
