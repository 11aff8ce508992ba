"""Tests for elfes.records: schema validation, the events file, console output, reading back."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from rich.console import Console

from elfes.records import (
    EVENT_DESCRIPTIONS,
    EVENT_FIELDS,
    EventsFileWarning,
    RunLogger,
    events_path,
    format_summary,
    read_events,
    summarize,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")


def _state(step: int, epoch: int = 0, **overrides):
    state = {
        "epoch": epoch,
        "next_batch": 0,
        "step": step,
        "batches": step,
        "samples": step * 32,
        "best_metric": None,
        "best_step": None,
        "evaluations_without_improvement": 0,
        "stop_reason": None,
    }
    return {**state, **overrides}


def started(step: int = 0, *, resumed_from: str | None = None, **state):
    event = {
        "event": "started" if resumed_from is None else "resumed",
        "world_size": 2,
        "precision": "bf16",
        "device": "cuda:0",
        "gradient_accumulation_steps": 1,
        "config": {"lr": 1e-3, "epochs": 2},
        "budget": {
            "epochs": 2,
            "max_steps": None,
            "planned_steps": 100,
            "updates_per_epoch": 50,
            "batches_per_epoch": 50,
        },
        "optimizer": {
            "class": "AdamW",
            "groups": [{"name": "decay", "lr": 1e-3, "weight_decay": 0.01, "num_parameters": 10}],
        },
        "ema_decay": None,
        "objective": None,
        "metadata": {},
        "state": _state(step, **state),
    }
    if resumed_from is not None:
        event["resumed_from"] = resumed_from
    return event


def train(step: int, loss: float = 0.1234, epoch: int = 0):
    return {
        "event": "train",
        "epoch": epoch,
        "step": step,
        "planned_steps": 100,
        "samples": step * 32,
        "metrics": {
            "loss": loss,
            "lr/0": 1e-3,
            "grad_norm": 1.5,
            "last_update_samples": 32,
            "samples_per_second": 5012.34,
            "accuracy": 0.5,
        },
    }


def evaluation(step: int, value: float, *, improved: bool, best: float, best_step: int):
    return {
        "event": "evaluation",
        "epoch": 0,
        "step": step,
        "weights": "ema",
        "metrics": {"val": {"accuracy": value, "loss": 0.3}},
        "duration_s": 1.5,
        "monitor": "val/accuracy",
        "improved": improved,
        "best_metric": best,
        "best_step": best_step,
    }


def checkpoint(step: int, reason: str = "interval"):
    return {
        "event": "checkpoint",
        "path": f"/runs/a/checkpoints/step-{step}",
        "epoch": 0,
        "step": step,
        "next_batch": step,
        "reason": reason,
        "best": False,
        "final": reason == "final",
        "bytes": 2_500_000,
        "duration_s": 0.25,
    }


def run_end(step: int, reason: str | None = None, **state):
    event = {
        "event": "finished" if reason is None else "stopped",
        "state": _state(step, **state),
        "train_s": 10.0,
        "evaluation_s": 2.0,
        "checkpoint_s": 0.5,
        "wall_s": 13.0,
    }
    if reason is not None:
        event["reason"] = reason
    return event


def stop_requested(step: int):
    return {
        "event": "stop_requested",
        "reason": "signal",
        "signal": "SIGTERM",
        "epoch": 0,
        "step": step,
    }


def every_event_kind():
    return [
        started(),
        train(20),
        {"event": "skipped", "epoch": 0, "step": 21, "reason": "amp_overflow"},
        evaluation(40, 0.7, improved=True, best=0.7, best_step=40),
        checkpoint(40),
        {"event": "export", "weights": "ema", "path": Path("/runs/a/model.pt")},
        stop_requested(45),
        run_end(45, reason="signal", best_metric=0.7, best_step=40),
    ]


def plain_console() -> Console:
    return Console(file=io.StringIO(), force_terminal=False, width=100)


def test_schema_covers_every_event_with_a_description():
    assert set(EVENT_FIELDS) == set(EVENT_DESCRIPTIONS)
    logged = {event["event"] for event in every_event_kind()}
    assert logged | {"resumed", "finished"} == set(EVENT_FIELDS)
    assert all(EVENT_DESCRIPTIONS.values())


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
        ({"step": 1}, "unknown event name None"),
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


def test_torn_last_line_is_skipped_with_warning_and_appending_resumes_cleanly(tmp_path):
    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        logger.log(started())
        logger.log(train(10))
    with events_path(tmp_path).open("a") as events_file:
        events_file.write('{"event": "train", "epoch": 0, "st')

    with pytest.warns(EventsFileWarning, match=r"events\.jsonl:3"):
        assert [event["event"] for event in read_events(tmp_path)] == ["started", "train"]

    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        logger.log(started(10, resumed_from="/runs/a/checkpoints/step-10"))
        logger.log(train(20))
    with pytest.warns(EventsFileWarning, match=r"events\.jsonl:3"):
        events = read_events(events_path(tmp_path))
    assert [event["event"] for event in events] == ["started", "train", "resumed", "train"]


def test_read_events_of_a_run_that_never_logged_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="not started logging"):
        read_events(tmp_path / "missing")


def test_plain_console_prints_timestamped_lines_without_control_characters(tmp_path):
    console = plain_console()
    events = every_event_kind()
    events.append({"event": "skipped", "epoch": 0, "step": 46, "reason": "bad\x1b[31m\rname"})
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        for event in events:
            logger.log(event)
    output = console.file.getvalue()

    control = [char for char in output if ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0]
    assert set(control) == {"\n"}
    lines = output.splitlines()
    assert len(lines) == len(events)
    assert all(TIMESTAMP.match(line) for line in lines)
    train_line = lines[1]
    assert "train epoch=0 step=20/100 loss=0.1234" in train_line
    assert "samples/s=5012.3" in train_line
    assert "evaluation" in lines[3] and "val/accuracy=0.7" in lines[3]
    assert lines[3].endswith(" best")
    assert "checkpoint" in lines[4] and "step=40" in lines[4]
    assert "SIGTERM" in lines[6]
    assert lines[7].split(" ", 2)[1] == "stopped"


def test_terminal_console_renders_bar_and_evaluation_lines(tmp_path):
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started())
        for step in (10, 20, 30):
            logger.log(train(step))
        logger.log(evaluation(30, 0.8, improved=True, best=0.8, best_step=30))
        logger.log(checkpoint(30))
        logger.log(run_end(30, reason="signal"))
        logger.log(started(30, resumed_from="/runs/a/checkpoints/step-30"))
        logger.log(train(40))
    output = console.file.getvalue()
    assert "━" in output, "a drawn progress bar"
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output)  # what a terminal shows, colours removed
    assert re.search(r"epoch 0 [━╺╸]+ +40/100 loss 0\.1234 5012\.3 samples/s", shown), "the bar and its columns"
    assert "\x1b[" in output  # a live display redraws in place
    assert "30/100" in output
    assert "samples/s" in output
    assert "evaluation epoch=0 step=30 weights=ema" in output
    assert "checkpoint epoch=0 step=30" in output
    assert len(read_events(tmp_path)) == 9


def test_summarize_a_stopped_and_resumed_run():
    events = [
        {**started(), "time": "2026-11-30T10:00:00+00:00"},
        train(20),
        evaluation(40, 0.7, improved=True, best=0.7, best_step=40),
        checkpoint(40),
        stop_requested(45),
        run_end(45, reason="preempted", best_metric=0.7, best_step=40),
        started(40, resumed_from="/runs/a/checkpoints/step-40", best_metric=0.7, best_step=40),
        train(80, epoch=1),
        evaluation(100, 0.6, improved=False, best=0.7, best_step=40),
        {
            **run_end(100, epoch=1, best_metric=0.7, best_step=40),
            "time": "2026-11-30T11:00:00+00:00",
        },
    ]
    summary = summarize(events)

    assert summary.status == "finished"
    assert (summary.step, summary.planned_steps, summary.epoch) == (100, 100, 1)
    assert summary.samples == 100 * 32
    assert (summary.best_metric, summary.best_step, summary.monitor) == (0.7, 40, "val/accuracy")
    assert (summary.starts, summary.resumes) == (2, 1)
    assert summary.stops == ("preempted",)
    assert summary.checkpoints == 1
    assert summary.last_checkpoint == "/runs/a/checkpoints/step-40"
    assert (summary.train_s, summary.evaluation_s, summary.checkpoint_s) == (20.0, 4.0, 1.0)
    assert summary.last_event_time == "2026-11-30T11:00:00+00:00"

    text = format_summary(summary)
    assert "status: finished" in text and "step 100/100" in text and "preempted" in text


def test_summarize_status_follows_the_last_start():
    assert summarize([started(), train(10)]).status == "running"
    assert summarize([started(), run_end(5, reason="signal")]).status == "stopped"
    resumed = started(5, resumed_from="/ckpt")
    assert summarize([started(), run_end(5, reason="signal"), resumed]).status == "running"
    assert "running" in format_summary(summarize([started()]))
    with pytest.raises(ValueError, match="no events"):
        summarize([])


def test_summarize_reads_back_what_the_logger_wrote(tmp_path):
    with RunLogger(tmp_path, is_main_process=True, console=plain_console()) as logger:
        for event in every_event_kind():
            logger.log(event)
    summary = summarize(read_events(tmp_path))
    assert summary.status == "stopped"
    assert summary.step == 45
    assert summary.last_event_time is not None


def test_import_does_not_import_torch():
    code = "import sys, elfes.records; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
