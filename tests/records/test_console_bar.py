"""The rich console on a terminal: a progress bar driven by train events, other events as lines above it."""

from __future__ import annotations

import re

from synthetic_events import (
    checkpoint,
    evaluation,
    failed,
    plain_console,
    run_end,
    started,
    stop_signal,
    terminal_console,
    train,
)

from elfes.records import RunLogger, read_events
from elfes.records.plain import format_number

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def shown(output: str) -> str:
    """What a terminal shows, colours and cursor movements removed."""
    return ESCAPES.sub("", output)


def test_terminal_console_renders_bar_and_evaluation_lines(tmp_path):
    console = terminal_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started())
        for step in (10, 20, 30):
            logger.log(train(step))
        logger.log(evaluation(30, 0.8, improved=True, best=0.8, best_step=30))
        logger.log(checkpoint(30))
        logger.log(run_end(30, reason="signal", next_batch=30))
        logger.log(started(30, resumed_from="/runs/a/checkpoints/step-30", next_batch=30))
        logger.log(train(40))
    output = console.file.getvalue()
    assert "━" in output, "a drawn progress bar"
    assert re.search(r"epoch 1\S* [━╺╸]+ +40/100 loss 0\.1234 5012\.3 samples/s", shown(output)), "the bar and its columns"
    assert "\x1b[" in output  # a live display redraws in place
    assert "30/100" in output
    assert "evaluation epoch=1" in output and "step=30 weights=ema" in output
    assert "checkpoint epoch=1" in output
    assert len(read_events(tmp_path)) == 9


def last_bar_position(output: str) -> str:
    """The M/N of the bar as last drawn."""
    return re.findall(r"[━╺╸]+ +(\d+/\d+) loss", shown(output))[-1]


def test_the_bar_of_a_finished_run_ends_complete(tmp_path):
    console = terminal_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started(planned_steps=48, epochs=3))
        for step in range(5, 48, 5):  # the last train event is at step 45
            logger.log(train(step, epoch=1 + (step - 1) // 16, planned_steps=48))
        logger.log(run_end(48, epoch=3))
    assert last_bar_position(console.file.getvalue()) == "48/48"


def test_the_bar_of_a_finished_run_ends_complete_when_it_stopped_early(tmp_path):
    console = terminal_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started(planned_steps=48, epochs=3))
        logger.log(train(20, epoch=2, planned_steps=48))
        logger.log(run_end(22, epoch=1, next_batch=12, stop_reason="early_stopping"))
    assert last_bar_position(console.file.getvalue()) == "22/22"


def test_the_bar_of_a_stopped_run_ends_at_the_step_it_stopped_at(tmp_path):
    console = terminal_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started(planned_steps=48, epochs=3))
        logger.log(train(15, planned_steps=48))
        logger.log(run_end(17, reason="SIGTERM", epoch=1, next_batch=2))
    assert last_bar_position(console.file.getvalue()) == "17/48"


def test_the_bar_and_the_lines_show_the_same_epoch(tmp_path):
    console = terminal_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started(planned_steps=48, epochs=3))
        first_frame = shown(console.file.getvalue())
        for step in range(5, 48, 5):
            logger.log(train(step, epoch=1 + (step - 1) // 16, planned_steps=48))
        logger.log(run_end(48, epoch=3))
    output = shown(console.file.getvalue())
    assert "epoch 1/3 " in first_frame and "started epoch=1/3 " in first_frame
    assert re.findall(r"epoch (\S+) [━╺╸]+", output)[-1] == "3/3"
    assert "finished epoch=3/3 " in output


def test_a_stop_signal_is_printed_at_once_above_the_bar(tmp_path):
    console = terminal_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started(planned_steps=48, epochs=3))
        logger.log(train(10, planned_steps=48))
        logger.log(stop_signal(12))
        assert "stop requested (SIGTERM): saving at the end of this window" in shown(console.file.getvalue())


def test_the_bar_of_a_failed_run_ends_at_the_step_it_failed_at(tmp_path):
    console = terminal_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started(planned_steps=48, epochs=3))
        logger.log(train(10, planned_steps=48))
        logger.log(failed(12, "ValueError", "bad batch"))
        output = shown(console.file.getvalue())
    assert last_bar_position(output) == "12/48"
    assert "failed epoch=1/3 step=12 ValueError: bad batch" in output


def test_a_terminal_shows_the_train_lines_above_the_bar(tmp_path):
    console = terminal_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started(planned_steps=48, epochs=3))
        for step in (5, 10):
            logger.log(train(step, planned_steps=48))
        output = shown(console.file.getvalue())
    for step in (5, 10):
        assert f"train epoch=1/3 step={step}/48 loss=0.1234 lr/0=0.001 grad_norm=1.5 accuracy=0.5 samples/s=5012.3" in output
    assert output.index("train epoch=1/3 step=5/48") < output.index("train epoch=1/3 step=10/48")


def test_a_terminal_shows_checkpoint_paths_relative_to_the_run_directory(tmp_path):
    run_dir = tmp_path / ("a-run-directory-with-a-long-name-" * 4)
    long_name = f"step-000030-epoch-0001-{'x' * 60}.pt"
    console = terminal_console()
    with RunLogger(run_dir, is_main_process=True, console=console) as logger:
        logger.log(started(planned_steps=48, epochs=3))
        logger.log({**checkpoint(30), "path": str(run_dir / "checkpoints" / long_name)})
        logger.log(run_end(30, reason="signal", next_batch=30))
        logger.log(started(30, resumed_from=str(run_dir / "checkpoints" / "last"), planned_steps=48, epochs=3))
    output = shown(console.file.getvalue())
    assert f"path=checkpoints/{long_name}" in output and "from=checkpoints/last" in output
    assert str(tmp_path) not in output
    assert [event["path"] for event in read_events(run_dir) if event["event"] == "checkpoint"] == [
        str(run_dir / "checkpoints" / long_name)], "the records keep the full path"


def test_log_files_keep_full_paths(tmp_path):
    console = plain_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log({**checkpoint(30), "path": str(tmp_path / "checkpoints" / "step-30.pt")})
    assert f"path={tmp_path}/checkpoints/step-30.pt" in console.file.getvalue()


def test_the_bar_starts_without_placeholders(tmp_path):
    console = terminal_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started(planned_steps=48, epochs=3))
        first_frame = shown(console.file.getvalue())
        assert re.search(r"epoch 1/3 [━╺╸ ]+ +0/48", first_frame), first_frame
        assert "n/a" not in first_frame


def test_the_bar_is_drawn_at_each_train_event_before_the_next_one(tmp_path):
    console = terminal_console()
    with RunLogger(tmp_path, is_main_process=True, console=console) as logger:
        logger.log(started(planned_steps=48, epochs=3))
        for step in (5, 10, 15):
            logger.log(train(step, loss=step / 100, planned_steps=48))
            drawn = shown(console.file.getvalue())
            # Drawn before the next event arrives, with the loss the line above it printed.
            assert last_bar_position(drawn) == f"{step}/48"
            assert re.findall(r"loss (\S+) 5012\.3 samples/s", drawn)[-1] == format_number(step / 100)
