"""The timeline of a run's records: attempts, the kept path, lost segments and markers (torch- and
matplotlib-free), on hand-written event sequences of every kind of interruption."""

from __future__ import annotations

import pytest
from synthetic_events import checkpoint, evaluation, failed, run_end, started, stop_requested, train

from elfes.records.timeline import build_timeline, event_scalars, select_metrics


def resumed(step: int):
    return started(step, resumed_from=f"/runs/a/checkpoints/step-{step}")


def steps(series) -> list[int]:
    return [point.step for point in series.kept]


def lost_steps(series) -> list[list[int]]:
    return [[point.step for point in segment] for segment in series.lost]


def stopped(step: int, signal: str):
    requested = {**stop_requested(step), "signal": signal, "reason": signal}
    return [requested, checkpoint(step, reason="stop"), run_end(step, reason=signal)]


def test_stops_and_a_kill_give_one_kept_path_and_a_separate_lost_segment():
    events = [
        started(), train(1, loss=1.0), train(2, loss=0.9), *stopped(2, "SIGUSR2"),
        resumed(2), train(3, loss=0.8), train(4, loss=0.7), evaluation(4, 0.5, improved=True, best=0.5, best_step=4),
        checkpoint(4), *stopped(5, "SIGTERM"),
        resumed(5), train(6, loss=0.66), train(7, loss=0.55),  # killed: no end event
        resumed(5), train(6, loss=0.6), train(7, loss=0.5), train(8, loss=0.4), run_end(8),
    ]
    timeline = build_timeline(events, launches=["submit", "requeue", "requeue", "resume"])

    loss = timeline.series["train/loss"]
    assert steps(loss) == [1, 2, 3, 4, 6, 7, 8]
    assert [point.value for point in loss.kept][-3:] == [0.6, 0.5, 0.4]  # the redo, not the lost values
    assert lost_steps(loss) == [[6, 7]]
    assert [point.value for point in loss.lost[0]] == [0.66, 0.55] and loss.lost[0][0].attempt == 3
    assert steps(timeline.series["eval/val/accuracy"]) == [4]
    assert [(m.kind, m.step, m.attempt, m.label) for m in timeline.markers] == [
        ("start", 0, 1, "start"),
        ("stop", 2, 1, "stop (SIGUSR2)"),
        ("requeue", 2, 2, "requeue"),
        ("stop", 5, 2, "stop (SIGTERM)"),
        ("requeue", 5, 3, "requeue"),
        ("killed", 7, 3, "killed"),
        ("resume", 5, 4, "resume"),
    ]
    assert [(a.end, a.last_step) for a in timeline.attempts] == [
        ("stopped", 2), ("stopped", 5), ("killed", 7), ("finished", 8)]
    assert [(span.attempt, span.after_step, span.last_step) for span in timeline.lost_spans] == [(3, 5, 7)]


def test_without_launches_every_resumed_start_is_a_resume():
    timeline = build_timeline([started(), train(1), *stopped(1, "SIGTERM"), resumed(1), train(2)])
    assert [m.kind for m in timeline.markers] == ["start", "stop", "resume"]
    assert timeline.attempts[-1].end == "running"  # the last attempt has no end yet: not a kill


def test_a_stop_the_launcher_recorded_as_cancelled_is_a_cancel():
    events = [started(), train(1), *stopped(1, "SIGTERM"), resumed(1), train(2)]
    assert build_timeline(events).markers[1].label == "stop (SIGTERM)"
    cancelled = build_timeline(events, launches=[None, "resume"], outcomes=["cancelled", None])
    assert cancelled.attempts[0].cancelled and cancelled.markers[1].label == "cancel (SIGTERM)"


def test_a_resume_from_an_older_checkpoint_loses_the_work_of_every_attempt_past_it():
    events = [started(), train(2), checkpoint(2), train(4), checkpoint(4), *stopped(5, "SIGTERM"),
              resumed(5), train(6), failed(6),
              resumed(2), train(3), train(4), train(5), train(6)]
    timeline = build_timeline(events)
    loss = timeline.series["train/loss"]
    assert steps(loss) == [2, 3, 4, 5, 6]
    assert lost_steps(loss) == [[4], [6]]  # attempt 1's step 4 and attempt 2's step 6 were both redone
    assert [(m.kind, m.step) for m in timeline.markers if m.kind in ("failed", "stop")] == [("stop", 5), ("failed", 6)]
    assert timeline.markers[3].label == "failed (ValueError)"
    assert [(s.attempt, s.after_step, s.last_step) for s in timeline.lost_spans] == [(1, 2, 5), (2, 5, 6)]


def test_a_kill_before_the_first_checkpoint_restarts_from_scratch_and_loses_everything_before():
    events = [started(), train(1, loss=2.0), train(2, loss=1.5), started(), train(1, loss=2.0), train(2, loss=1.5)]
    timeline = build_timeline(events)
    assert steps(timeline.series["train/loss"]) == [1, 2]
    assert lost_steps(timeline.series["train/loss"]) == [[1, 2]]
    assert [(m.kind, m.step) for m in timeline.markers] == [("start", 0), ("killed", 2), ("start", 0)]


def test_events_before_any_start_form_a_first_attempt():
    timeline = build_timeline([train(3), train(4), *stopped(4, "SIGINT"), resumed(4), train(5)])
    assert timeline.attempts[0].start_step == 3 and timeline.attempts[0].launch == "resume"
    assert steps(timeline.series["train/loss"]) == [3, 4, 5]


def test_null_values_and_non_numbers_are_left_out_of_the_series():
    event = train(5)
    event["metrics"].update(loss=None, flag=True, note="text")
    assert "train/loss" not in event_scalars(event)
    assert {"train/grad_norm", "train/lr/0", "train/accuracy"} <= set(event_scalars(event))
    assert not {"train/flag", "train/note"} & set(event_scalars(event))
    assert event_scalars(checkpoint(5)) == {}


def test_metric_selection_defaults_to_the_training_loss_and_every_evaluation_metric():
    timeline = build_timeline([started(), train(4), evaluation(4, 0.5, improved=True, best=0.5, best_step=4)])
    assert select_metrics([timeline]) == ("train/loss", "eval/val/accuracy", "eval/val/loss")
    assert select_metrics([timeline], ["train/grad_norm", "train/grad_norm"]) == ("train/grad_norm",)
    assert timeline.metric_names[0] == "train/loss"


def test_an_unknown_metric_is_refused_with_the_names_the_runs_have():
    timeline = build_timeline([started(), train(4)])
    with pytest.raises(ValueError, match=r"'validation/loss'.*the runs have: train/loss, train/lr/0"):
        select_metrics([timeline], ["validation/loss"])
    with pytest.raises(ValueError, match="no training loss or evaluation metric yet"):
        select_metrics([build_timeline([started()])])


def test_a_timeline_built_from_a_stream_keeps_the_start_events_and_equals_one_built_from_a_list():
    from elfes.records.timeline import TimelineBuilder

    events = [started(), train(1, loss=1.0), train(2, loss=0.9), *stopped(2, "SIGTERM"),
              resumed(1), train(2, loss=0.8), train(3, loss=0.7), run_end(3)]
    builder = TimelineBuilder()
    for event in iter(events):  # one pass, nothing kept but what the timeline needs
        builder.add(event)
    assert [event["event"] for event in builder.start_events] == ["started", "resumed"]
    streamed = builder.build(launches=["submit", "resume"])
    assert streamed == build_timeline(events, launches=["submit", "resume"])
    assert lost_steps(streamed.series["train/loss"]) == [[2]]
    assert steps(streamed.series["train/loss"]) == [1, 2, 3]
