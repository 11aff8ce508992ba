"""read_events and iter_events: the events of a run, a line that is not an event skipped with a warning
naming it."""

from __future__ import annotations

import json

import pytest
from synthetic_events import plain_console, started, train

from elfes.records import EventsFileWarning, RunLogger, events_path, iter_events, read_events


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


def _write_lines(tmp_path, lines: list[str]):
    events_path(tmp_path).write_text("".join(line + "\n" for line in lines))


def test_lines_that_are_not_one_event_each_are_skipped_wherever_they_stand_in_a_long_file(tmp_path, monkeypatch):
    # Lines are parsed a chunk at a time; a chunk holding a bad line is read line by line, so a line that is
    # two objects, a list, a torn line or an object without "event" is skipped just as alone, and named.
    from elfes.records import reader

    monkeypatch.setattr(reader, "CHUNK_LINES", 4)
    good = [json.dumps({"event": "train", "step": step, "metrics": {"loss": 1 / step}}) for step in range(1, 12)]
    bad = {3: '{"event": "train", "step": 90}, {"event": "train", "step": 91}', 6: "[1, 2]",
           8: '{"event": "train", "st', 10: '{"step": 5}', 11: ""}
    lines = list(good)
    for index in sorted(bad):
        lines.insert(index - 1, bad[index])
    _write_lines(tmp_path, lines)
    with pytest.warns(EventsFileWarning) as caught:
        events = read_events(tmp_path)
    assert [event["step"] for event in events] == list(range(1, 12))
    assert sorted(int(str(warning.message).split(":")[1]) for warning in caught) == [3, 6, 8, 10]


def test_iter_events_streams_the_same_events_and_refuses_a_missing_file_at_once(tmp_path):
    _write_lines(tmp_path, [json.dumps({"event": "train", "step": step}) for step in range(1, 10_000)])
    stream = iter_events(tmp_path)
    assert next(stream) == {"event": "train", "step": 1}
    assert [next(stream)] + list(stream) == read_events(tmp_path)[1:]
    with pytest.raises(FileNotFoundError, match="not started logging"):
        iter_events(tmp_path / "missing")  # before any event is asked for
