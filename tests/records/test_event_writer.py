"""RunLogger: one flushed, UTC-stamped JSON line per event, on the main process only."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta

import pytest
from synthetic_events import every_event_kind, plain_console, started, train

from elfes.records import EventsFileWarning, RunLogger, events_path, read_events


def test_log_writes_one_flushed_line_per_event_with_utc_time(tmp_path):
    run_dir = tmp_path / "nested" / "run"
    events = every_event_kind()
    with RunLogger(run_dir, is_main_process=True, console=plain_console()) as logger:
        for count, event in enumerate(events, start=1):
            logger.log(event)
            # Read while the logger is open: each line must already be on disk.
            lines = events_path(run_dir).read_text().splitlines()
            assert len(lines) == count
    records = [json.loads(line) for line in lines]
    assert [record["event"] for record in records] == [event["event"] for event in events]
    for record in records:
        assert record["time"].endswith("+00:00")
        assert datetime.fromisoformat(record["time"]).utcoffset() == timedelta(0)
    assert records[5]["path"] == "/runs/a/model.pt"
    assert records[1]["metrics"]["loss"] == pytest.approx(0.1234)


def test_non_finite_floats_are_recorded_as_null(tmp_path):
    event = train(5, loss=math.nan)
    event["metrics"]["grad_norm"] = math.inf
    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        logger.log(event)
    (record,) = read_events(tmp_path)
    assert record["metrics"]["loss"] is None
    assert record["metrics"]["grad_norm"] is None


def test_non_main_process_writes_and_prints_nothing(tmp_path):
    console = plain_console()
    run_dir = tmp_path / "run"
    with RunLogger(run_dir, is_main_process=False, console=console) as logger:
        for event in every_event_kind():
            logger.log(event)
    assert not run_dir.exists()
    assert console.file.getvalue() == ""


def test_non_main_process_still_validates(tmp_path):
    with RunLogger(tmp_path, is_main_process=False) as logger:
        with pytest.raises(ValueError, match="nonsense"):
            logger.log({"event": "nonsense"})


@pytest.mark.parametrize(
    ("event", "pattern"),
    [
        ({"event": "nonsense", "step": 1}, "unknown event name 'nonsense'"),
        ({"event": "export", "weights": "raw"}, "'export'.*missing.*'path'"),
        ({**train(1), "time": "yesterday"}, "'train'.*'time'"),
        ({**started(), "state": {"step": 0}}, "'started'.*'state'.*'best_metric'"),
    ],
)
def test_schema_violations_raise_and_write_nothing(tmp_path, event, pattern):
    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        with pytest.raises(ValueError, match=pattern):
            logger.log(event)
        assert not events_path(tmp_path).exists()
        logger.log(train(1))
        with pytest.raises(ValueError, match=pattern):
            logger.log(event)
    assert len(events_path(tmp_path).read_text().splitlines()) == 1


def test_extra_fields_are_kept(tmp_path):
    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        logger.log({**train(1), "host": "node-7"})
    assert read_events(tmp_path)[0]["host"] == "node-7"


def test_value_without_json_form_raises_type_error_naming_the_field(tmp_path):
    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        with pytest.raises(TypeError, match=r"train\.metrics\.loss.*\.item\(\)"):
            logger.log({**train(1), "metrics": {"loss": object()}})
    assert not events_path(tmp_path).exists()


def test_log_after_close_raises(tmp_path):
    logger = RunLogger(tmp_path, is_main_process=True, console=plain_console())
    logger.close()
    logger.close()
    with pytest.raises(RuntimeError, match="closed"):
        logger.log(train(1))


def test_appending_after_a_torn_last_line_starts_on_a_fresh_line(tmp_path):
    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        logger.log(started())
        logger.log(train(10))
    with events_path(tmp_path).open("a") as events_file:
        events_file.write('{"event": "train", "epoch": 1, "st')

    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        logger.log(started(10, resumed_from="/runs/a/checkpoints/step-10"))
        logger.log(train(20))
    with pytest.warns(EventsFileWarning, match=r"events\.jsonl:3"):
        events = read_events(events_path(tmp_path))
    assert [event["event"] for event in events] == ["started", "train", "resumed", "train"]
