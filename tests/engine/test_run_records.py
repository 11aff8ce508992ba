"""A real training run with evaluation, a pause and a resume leaves a complete, readable record."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import torch
from rich.console import Console
from workloads import RunSpec, build, fresh_accelerate, mse_step

from elfes.contract import EventKind
from elfes.engine import RunLogger, StopRequest
from elfes.records import (
    EVENT_FIELDS,
    EventsFileWarning,
    events_path,
    read_events,
    summarize,
)

SPEC = RunSpec(epochs=2, log_every=2)




def pause_then_resume(run_dir: Path, console: Console) -> int:
    """Train SPEC, pausing once in the 3rd window; returns the number of windows before the pause."""
    fresh_accelerate()
    with RunLogger(run_dir, is_main_process=True, console=console) as logger:
        run = build(SPEC, logger=logger)
        stop = StopRequest()
        calls = 0

        def step(model, batch):
            nonlocal calls
            calls += 1
            if calls == 2 * SPEC.accumulation + 1:
                stop.request("maintenance")
            return mse_step(model, batch)

        run.trainer.step = step
        run.trainer.train(run.config, checkpoint_dir=run_dir / "checkpoints", stop=stop, metadata={"data": "toy"})
    fresh_accelerate()
    with RunLogger(run_dir, is_main_process=True, console=console) as logger:
        run = build(SPEC, logger=logger)
        run.trainer.train(run.config, checkpoint_dir=run_dir / "checkpoints", resume_from=run_dir / "checkpoints" / "last")
    return 3


@pytest.fixture(scope="module")
def paused_and_resumed(tmp_path_factory) -> Path:
    """The run directory of SPEC paused once and resumed (one run for the tests that only read its records)."""
    run_dir = tmp_path_factory.mktemp("paused-and-resumed")
    pause_then_resume(run_dir, Console(file=io.StringIO(), force_terminal=False))
    return run_dir


def test_events_of_a_paused_and_resumed_run(paused_and_resumed):
    events = read_events(paused_and_resumed)
    names = [event["event"] for event in events]

    # The story, in order: start, train, evaluate, checkpoint, pause, resume, ..., finish.
    assert names[0] == "started"
    stop_index = names.index("stop_requested")
    assert names[stop_index + 1] == "checkpoint" and events[stop_index + 1]["reason"] == "stop"
    assert names[stop_index + 2] == "stopped"
    assert names[stop_index + 3] == "resumed"
    assert names[-2:] == ["checkpoint", "finished"] and events[-2]["final"] is True
    assert {"train", "evaluation", "checkpoint"} <= set(names[:stop_index])
    assert {"train", "evaluation"} <= set(names[stop_index:])

    for event in events:
        assert set(EVENT_FIELDS[event["event"]]) <= set(event), event["event"]
        stamp = datetime.fromisoformat(event["time"])
        assert stamp.utcoffset() == timedelta(0)

    started = events[0]
    assert started["metadata"] == {"data": "toy"}
    assert started["world_size"] == 1 and started["precision"] == "no"
    assert started["ema_decay"] == SPEC.ema_decay
    assert [group["name"] for group in started["optimizer"]["groups"]] == ["decay", "no_decay"]
    assert started["budget"]["planned_steps"] == 8 and started["budget"]["updates_per_epoch"] == 4

    stopped, resumed = events[stop_index + 2], events[stop_index + 3]
    assert stopped["reason"] == "maintenance" and stopped["state"]["stop_reason"] == "maintenance"
    assert events[stop_index]["signal"] is None
    # The resume says where it came from and from which position.
    assert resumed["resumed_from"] == events[stop_index + 1]["path"]
    assert resumed["state"] == {**stopped["state"], "stop_reason": "maintenance"}
    assert resumed["state"]["next_batch"] == 3 * SPEC.accumulation and resumed["state"]["step"] == 3
    # Its optimizer groups are described after the restore: the checkpoint's learning rates, not the new trainer's.
    restored = torch.load(resumed["resumed_from"], map_location="cpu", weights_only=True)["optimizer"]["param_groups"]
    resumed_rates = [group["lr"] for group in resumed["optimizer"]["groups"]]
    assert resumed_rates == [group["lr"] for group in restored]
    assert resumed_rates != [group["lr"] for group in started["optimizer"]["groups"]]
    assert set(resumed) - set(started) == {"resumed_from", "past_budget"} and set(started) <= set(resumed)

    trains = [event for event in events if event["event"] == "train"]
    for event in trains:
        metrics = event["metrics"]
        assert {"loss", "mae", "max_error", "lr/decay", "lr/no_decay", "grad_norm", "last_update_samples"} <= set(metrics)
        assert metrics["samples_per_second"] > 0
        assert metrics["grad_norm"] > 0
        assert event["step"] % SPEC.log_every == 0
    # The warmup schedule is visible in the recorded learning rates.
    assert trains[0]["metrics"]["lr/decay"] < trains[1]["metrics"]["lr/decay"]
    # The last update of an epoch has the short tail window (one batch of 2 samples).
    tail = next(event for event in trains if event["step"] == 4)
    assert tail["metrics"]["last_update_samples"] == 2

    evaluations = [event for event in events if event["event"] == "evaluation"]
    assert all(event["weights"] == "ema" for event in evaluations)
    assert all(event["duration_s"] >= 0 and "loss" in event["metrics"]["validation"] for event in evaluations)

    finished = events[-1]
    assert finished["state"]["step"] == 8 and finished["state"]["stop_reason"] is None
    assert finished["train_s"] > 0 and finished["wall_s"] >= finished["train_s"] + finished["checkpoint_s"]

    summary = summarize(events)
    assert summary.status == "finished" and summary.resumes == 1 and summary.stops == ("maintenance",)
    assert summary.step == 8 and summary.best_step == finished["state"]["best_step"]


def test_console_without_a_terminal_prints_plain_lines(tmp_path):
    output = io.StringIO()
    pause_then_resume(tmp_path, Console(file=output, force_terminal=False, width=120))
    text = output.getvalue()
    assert text, "the main process prints progress lines"
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", text), "no escape codes or control characters"
    lines = text.splitlines()
    assert all(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", line) for line in lines), lines[:3]
    assert any(" train " in line and "loss=" in line for line in lines)
    assert any(" evaluation " in line for line in lines)
    assert any(" resumed " in line for line in lines)


def test_a_torn_last_line_from_a_killed_run_is_skipped_and_logging_continues(tmp_path):
    pause_then_resume(tmp_path, Console(file=io.StringIO(), force_terminal=False))
    path = events_path(tmp_path)
    complete = len(read_events(tmp_path))
    with open(path, "a") as stream:
        stream.write('{"event": "train", "epoch": 2, "st')  # what a SIGKILL mid-write leaves
    with pytest.warns(EventsFileWarning):
        assert len(read_events(tmp_path)) == complete
    fresh_accelerate()
    with RunLogger(tmp_path, is_main_process=True, console=Console(file=io.StringIO())) as logger:
        run = build(SPEC.with_(epochs=3), logger=logger)
        extended = r"WarmupDecay restored from .* ends at step 8 \(total_steps\), but this run now plans 12 steps"
        with pytest.warns(UserWarning, match=extended):
            run.trainer.train(run.config, checkpoint_dir=tmp_path / "checkpoints", resume_from=tmp_path / "checkpoints" / "final")
    with pytest.warns(EventsFileWarning):
        events = read_events(tmp_path)
    assert [event["event"] for event in events].count("resumed") == 2
    assert events[-1]["event"] == "finished" and events[-1]["state"]["epoch"] == 3


def test_only_the_main_process_writes_or_prints(tmp_path):
    output = io.StringIO()
    fresh_accelerate()
    with RunLogger(tmp_path, is_main_process=False, console=Console(file=output)) as logger:
        run = build(SPEC.with_(epochs=1), logger=logger)
        run.trainer.train(run.config)
    assert not events_path(tmp_path).exists()
    assert output.getvalue() == ""


def test_every_kind_a_run_writes_is_a_member_and_its_lines_are_plain_json(paused_and_resumed):
    """The engine writes each kind through elfes.contract.EventKind (tests/records/test_event_kinds.py holds the
    sources to it): every line of a real run's events.jsonl reads back through the enum, and is the line its
    kind's word gives, so nothing of the enum reaches the file."""
    lines = events_path(paused_and_resumed).read_bytes().splitlines()
    kinds = [EventKind(json.loads(line)["event"]) for line in lines]  # ValueError for a kind that is no member
    assert {EventKind.STARTED, EventKind.TRAIN, EventKind.EVALUATION, EventKind.CHECKPOINT, EventKind.STOP_REQUESTED,
            EventKind.STOPPED, EventKind.RESUMED, EventKind.FINISHED} <= set(kinds)
    for line, kind in zip(lines, kinds):
        assert line.startswith(b'{"event": "' + kind.value.encode() + b'", "time": "'), line
        assert json.dumps({**json.loads(line), "event": kind}).encode() == line
