"""Plain lines: one timestamped line per event, without control characters (SLURM logs, CI)."""

from __future__ import annotations

import re

import pytest
from synthetic_events import (
    checkpoint,
    evaluation,
    every_event_kind,
    failed,
    plain_console,
    run_end,
    started,
    stop_signal,
    train,
)

from elfes.records import RunLogger
from elfes.records.plain import format_bytes

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")


def logged_lines(tmp_path, events) -> list[str]:
    console = plain_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        for event in events:
            logger.log(event)
    return console.file.getvalue().splitlines()


def test_plain_console_prints_timestamped_lines_without_control_characters(tmp_path):
    events = every_event_kind()
    events.append({"event": "skipped", "epoch": 1, "step": 46, "reason": "bad\x1b[31m\rname"})
    console = plain_console()
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
    assert "train epoch=1/2 step=20/100 loss=0.1234" in train_line
    assert "samples/s=5012.3" in train_line
    assert "evaluation" in lines[3] and "val/accuracy=0.7" in lines[3]
    assert lines[3].endswith(" best")
    assert "checkpoint" in lines[4] and "step=40" in lines[4]
    assert "stop requested (SIGTERM)" in lines[6]
    assert "stop_requested" in lines[7] and "SIGTERM" in lines[7]
    assert lines[8].split(" ", 2)[1] == "stopped"
    assert "warning epoch=2/2 step=45 stream_replay: Resumed the training stream at batch 45" in lines[10]
    assert lines[11].split(" ", 2)[1] == "failed"


def test_every_line_names_the_epoch_the_run_is_in_out_of_the_budget(tmp_path):
    # A 3-epoch run of 16 updates per epoch: step 16 is the last update of epoch 1.
    events = [
        started(planned_steps=48, epochs=3),
        train(15, epoch=1, planned_steps=48),
        evaluation(16, 0.5, improved=True, best=0.5, best_step=16, epoch=1),
        run_end(20, reason="SIGTERM", epoch=1, next_batch=4),
        started(20, resumed_from="/ckpt", planned_steps=48, epochs=3, epoch=1, next_batch=4),
        run_end(48, epoch=3),
    ]
    epochs = [re.search(r" epoch=(\S+)", line)[1] for line in logged_lines(tmp_path, events)]
    assert epochs == ["1/3", "1/3", "1/3", "2/3", "2/3", "3/3"]


def test_a_resume_at_an_epoch_boundary_is_still_in_the_epoch_that_ended(tmp_path):
    events = [started(32, resumed_from="/ckpt", planned_steps=48, epochs=3, epoch=2, next_batch=0)]
    assert " epoch=2/3 step=32/48 " in logged_lines(tmp_path, events)[0]


@pytest.mark.parametrize(
    ("size_bytes", "expected"),
    [(0, "0 B"), (512, "512 B"), (27_000, "27.0 KB"), (27_648, "27.6 KB"), (999_960, "1.0 MB"),
     (2_500_000, "2.5 MB"), (3_200_000_000, "3.2 GB"), (None, "n/a")],
)
def test_sizes_are_shown_in_bytes_kilobytes_megabytes_or_gigabytes(size_bytes, expected):
    assert format_bytes(size_bytes) == expected


def test_a_small_checkpoint_shows_its_size_in_kilobytes(tmp_path):
    (line,) = logged_lines(tmp_path, [checkpoint(16, size_bytes=27_000)])
    assert " size=27.0 KB " in line


def test_a_stop_signal_says_at_once_that_the_run_saves_at_the_end_of_the_window(tmp_path):
    lines = logged_lines(tmp_path, [stop_signal(15), stop_signal(15, signal=None, reason="maintenance")])
    assert lines[0].endswith(" stop requested (SIGTERM): saving at the end of this window; epoch=1 step=15")
    assert " stop requested (maintenance): saving at the end of this window" in lines[1]


def test_a_failure_shows_the_exception_type_and_message_on_one_line(tmp_path):
    events = [started(planned_steps=48, epochs=3), failed(15, "RuntimeError", "CUDA out of memory.\nTried 2 GiB")]
    line = logged_lines(tmp_path, events)[1]
    assert line.split(" ", 1)[1] == "failed epoch=1/3 step=15 RuntimeError: CUDA out of memory. | Tried 2 GiB"


@pytest.mark.parametrize("past_budget", [True, None], ids=["field", "older record"])
def test_a_resume_past_the_new_budget_says_there_is_nothing_to_train(tmp_path, past_budget):
    resumed = started(320, resumed_from="/ckpt", planned_steps=160, epochs=10, epoch=20)
    if past_budget is not None:
        resumed["past_budget"] = past_budget
    (line,) = logged_lines(tmp_path, [resumed])
    assert "already at step 320, past the 160 steps this budget allows: nothing to train" in line


def test_a_resume_within_its_budget_says_nothing_of_it(tmp_path):
    resumed = {**started(80, resumed_from="/ckpt", planned_steps=160, epochs=10, epoch=5), "past_budget": False}
    (line,) = logged_lines(tmp_path, [resumed])
    assert "nothing to train" not in line


def test_learning_rates_of_named_and_unnamed_groups_follow_the_loss(tmp_path):
    event = train(15)
    event["metrics"] = {"loss": 0.5, "grad_norm": 1.5, "lr/decay": 1e-3, "lr/no_decay": 5e-4, "lr/2": 3e-5,
                        "lr/head layer": 2e-4}
    (line,) = logged_lines(tmp_path, [event])
    assert "loss=0.5 lr/decay=0.001 lr/no_decay=0.0005 lr/2=3e-05 lr/head layer=0.0002 grad_norm=1.5" in line
