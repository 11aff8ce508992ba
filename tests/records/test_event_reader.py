"""read_events: the events of a run, a torn line skipped with a warning naming it."""

from __future__ import annotations

import pytest
from synthetic_events import plain_console, started, train

from elfes.records import EventsFileWarning, RunLogger, events_path, read_events


def test_torn_last_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path):
    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        logger.log(started())
        logger.log(train(10))
    with events_path(tmp_path).open("a") as events_file:
        events_file.write('{"event": "train", "epoch": 1, "st')

    with pytest.warns(EventsFileWarning, match=r"events\.jsonl:3"):
        assert [event["event"] for event in read_events(tmp_path)] == ["started", "train"]


def test_reads_the_run_directory_or_the_file_itself(tmp_path):
    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        logger.log(started())
    assert read_events(tmp_path) == read_events(events_path(tmp_path))


def test_read_events_of_a_run_that_never_logged_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="not started logging"):
        read_events(tmp_path / "missing")
