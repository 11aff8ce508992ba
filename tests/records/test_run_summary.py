"""summarize/format_summary: where a run stands, from its events alone."""

from __future__ import annotations

import pytest
from synthetic_events import (
    checkpoint,
    evaluation,
    every_event_kind,
    failed,
    plain_console,
    run_end,
    started,
    stop_requested,
    stop_signal,
    train,
)

from elfes.records import RunLogger, format_summary, read_events, summarize


def test_summarize_a_stopped_and_resumed_run():
    events = [
        {**started(), "time": "2026-11-30T10:00:00+00:00"},
        train(20),
        evaluation(40, 0.7, improved=True, best=0.7, best_step=40),
        checkpoint(40),
        stop_requested(45),
        run_end(45, reason="preempted", best_metric=0.7, best_step=40, next_batch=45),
        started(40, resumed_from="/runs/a/checkpoints/step-40", best_metric=0.7, best_step=40, next_batch=40),
        train(80, epoch=2),
        evaluation(100, 0.6, improved=False, best=0.7, best_step=40, epoch=2),
        {
            **run_end(100, epoch=2, best_metric=0.7, best_step=40),
            "time": "2026-11-30T11:00:00+00:00",
        },
    ]
    summary = summarize(events)

    assert summary.status == "finished"
    assert (summary.step, summary.planned_steps, summary.epoch) == (100, 100, 2)
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
    assert "epoch 2/2" in text


def test_the_summary_epoch_is_the_epoch_the_run_is_in():
    # Stopped 4 batches into epoch 2 of 3: the state counts 1 completed epoch.
    summary = summarize([started(planned_steps=48, epochs=3), run_end(20, reason="SIGTERM", epoch=1, next_batch=4)])
    assert (summary.epoch, summary.epochs) == (2, 3)
    assert "progress: epoch 2/3, step 20/48" in format_summary(summary)


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
    assert summary.status == "failed"
    assert summary.step == 47
    assert summary.last_event_time is not None
    assert summary.warnings == (every_event_kind()[-2]["message"],)  # said since the latest start
    assert "warning: Resumed the training stream at batch 45" in format_summary(summary)
    assert summarize([*every_event_kind(), started(47, resumed_from="/ckpt", next_batch=47)]).warnings == ()


def test_a_run_whose_last_attempt_failed_is_failed_with_its_message():
    summary = summarize([started(), train(10), failed(12, "ValueError", "labels out of range")])
    assert summary.status == "failed"
    assert summary.failure == "ValueError: labels out of range"
    text = format_summary(summary)
    assert "status: failed" in text and "failure: ValueError: labels out of range" in text
    resumed = started(10, resumed_from="/ckpt", next_batch=10)
    again = summarize([started(), failed(12), resumed])
    assert (again.status, again.failure) == ("running", None)


def test_a_stop_requested_but_not_yet_saved_is_reported():
    summary = summarize([started(), train(10), stop_signal(12)])
    assert (summary.status, summary.pending_stop) == ("running", "SIGTERM")
    assert "stop requested (SIGTERM)" in format_summary(summary)
    saved = summarize([started(), stop_signal(12), run_end(13, reason="SIGTERM", next_batch=13)])
    assert (saved.status, saved.pending_stop) == ("stopped", None)
