"""What the trainer tells its heartbeat (elfes/engine/heartbeat.py), read by the launcher's hang watchdog:
a beat per window, boundary, evaluation batch and checkpoint write, and a first-of-its-kind beat where
slow work is expected (the first window of each epoch, the first batch of each evaluation loader).
A real single-process trainer; the heartbeat only records what it is told."""

from __future__ import annotations

from workloads import RunSpec, build, fresh_accelerate

from elfes.engine import Heartbeat, StopRequest


class RecordingHeartbeat(Heartbeat):
    def __init__(self) -> None:
        super().__init__()
        self.beats: list[tuple[str, bool]] = []  # (phase, first of its kind)

    def beat(self, phase: str) -> None:
        self.beats.append((phase, False))
        super().beat(phase)

    def beat_first(self, phase: str) -> None:
        self.beats.append((phase, True))
        super().beat_first(phase)


def test_the_first_window_of_each_epoch_and_of_each_evaluation_is_marked_a_first(tmp_path) -> None:
    fresh_accelerate()
    run = build(RunSpec())  # windows of 3, 3, 3, 1 batches: 4 per epoch, 2 epochs; 4 evaluation batches
    stop = StopRequest()
    heartbeat = stop.heartbeat = RecordingHeartbeat()
    state = run.trainer.train(run.config, checkpoint_dir=tmp_path / "checkpoints", stop=stop)
    beats = heartbeat.beats

    windows = [first for phase, first in beats if phase == "training"]
    assert windows == [True, False, False, False] * 2, beats
    evaluations = [index for index, beat in enumerate(beats) if beat == ("evaluating", True)]
    assert evaluations, beats
    for index in evaluations:  # a first beat, then one per later batch
        assert beats[index + 1:index + 4] == [("evaluating", False)] * 3, beats
        assert beats[index + 4] != ("evaluating", False), beats
    assert ("checkpointing", False) in beats
    assert beats[0] == ("starting", False) and beats[-1] == ("ended", False)
    assert (heartbeat.step, heartbeat.updates, heartbeat.first) == (state.step, 8, False)

    # After train() returned the job's own code runs unwatched: an evaluation then gives no beat.
    heartbeat.beats.clear()
    run.trainer.evaluate(heartbeat=heartbeat)
    assert heartbeat.beats == [] and heartbeat.phase == "ended"
