"""A real run preempted twice and SIGKILLed once (see interrupted_run.py), drawn by `elfes plot` and
mirrored to TensorBoard. Golden-free: the plot's data is read back from the matplotlib figure it saved,
and the TensorBoard files with TensorBoard's own event reader; both are checked against the run's
records and state.json."""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest
from interrupted_run import InterruptedRun, attempt_events, events, run_interrupted_job
from launching import kill_local_run

from elfes.launcher.commands.plot import plot
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths

pytest.importorskip("matplotlib", reason="the plot extra: pip install -e '.[test]' installs it")
pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install -e '.[test]' installs it")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("interrupted")
    try:
        yield run_interrupted_job(folder)
    finally:
        kill_local_run(folder / "interrupted")


def last_value_per_step(run_dir: Path, event_name: str, metric) -> dict[int, float]:
    """Step -> the value the run's records hold last for it (a redo's, where a step was trained twice)."""
    return {e["step"]: metric(e) for e in events(run_dir) if e["event"] == event_name}


def kill_facts(run: InterruptedRun) -> tuple[int, list[dict]]:
    """The step of the last checkpoint before the kill, and the train records of attempt 3 past it."""
    before_kill = [e for attempt in (1, 2, 3) for e in attempt_events(run.run_dir, attempt)]
    last_checkpoint = max(e["step"] for e in before_kill if e["event"] == "checkpoint")
    lost = [e for e in attempt_events(run.run_dir, 3) if e["event"] == "train" and e["step"] > last_checkpoint]
    return last_checkpoint, lost


def lines(ax, prefix: str) -> list:
    return [line for line in ax.get_lines() if (line.get_gid() or "").startswith(prefix)]


def test_the_plot_has_one_kept_path_the_lost_segment_apart_and_every_interruption_marked(interrupted, tmp_path):
    run_dir = interrupted.run_dir
    result = plot([run_dir], output=tmp_path / "interrupted.png")
    assert result.output.read_bytes().startswith(PNG_SIGNATURE)
    assert result.metrics == ("train/loss", "eval/validation/loss", "eval/validation/mae", "eval/validation/rmse")
    panels = {ax.get_gid().removeprefix("panel:"): ax for ax in result.figure.get_axes()}
    assert list(panels) == [*result.metrics, "time"]  # the goodput's time bars last
    loss_panel = panels["train/loss"]

    # The kept path: one line, every step once and in order, each with the value the records keep last.
    (kept,) = lines(loss_panel, "kept:interrupted")
    kept_loss = last_value_per_step(run_dir, "train", lambda e: e["metrics"]["loss"])
    assert list(kept.get_xdata()) == sorted(kept_loss) == list(range(1, 25))
    assert list(kept.get_ydata()) == [kept_loss[step] for step in range(1, 25)]
    (kept_eval,) = lines(panels["eval/validation/loss"], "kept:interrupted")
    assert list(kept_eval.get_xdata()) == [8, 16, 24]

    # The lost segment: its own faded line, the steps attempt 3 logged past its last checkpoint.
    last_checkpoint, lost_records = kill_facts(interrupted)
    assert len(lost_records) >= 2 and lost_records[-1]["step"] == interrupted.killed_at_step
    (lost,) = lines(loss_panel, "lost:")
    assert lost.get_gid() == "lost:3:interrupted" and lost.get_alpha() < 1
    assert list(lost.get_xdata()) == [e["step"] for e in lost_records]
    assert list(lost.get_ydata()) == [e["metrics"]["loss"] for e in lost_records]
    assert lines(panels["eval/validation/loss"], "lost:") == []  # no evaluation was lost

    # The markers, at the steps state.json recorded for each attempt, in every panel.
    attempts = run_state.load_state(RunPaths(run_dir)).attempts
    assert [(a.outcome, a.signal, a.launch) for a in attempts] == [
        ("requeued", "SIGUSR2", "submit"), ("requeued", "SIGUSR2", "requeue"), ("lost", None, "requeue"),
        ("finished", None, "resume")]
    first_stop, second_stop = attempts[0].step, attempts[1].step
    expected = {("start", 1, 0), ("stop", 1, first_stop), ("requeue", 2, first_stop), ("stop", 2, second_stop),
                ("requeue", 3, second_stop), ("killed", 3, interrupted.killed_at_step), ("resume", 4, last_checkpoint)}
    for ax in (panels[metric] for metric in result.metrics):
        drawn = set()
        for line in lines(ax, "marker:"):
            _, kind, attempt, run = line.get_gid().split(":", 3)
            assert run == "interrupted" and line.get_xdata()[0] == line.get_xdata()[1]
            drawn.add((kind, int(attempt), line.get_xdata()[0]))
        assert drawn == expected
    labels = {text.get_position()[0]: text.get_text() for text in loss_panel.texts}
    assert labels[first_stop] == "SIGUSR2 / requeue"
    assert labels[interrupted.killed_at_step] == "kill"
    assert "4 attempts: 2 requeues, 1 kill, 1 resume" in result.figure.get_suptitle()  # a preemption counts once


def test_tensorboard_holds_each_steps_loss_once_equal_to_the_run_records(interrupted):
    run_dir = interrupted.run_dir
    accumulator = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    kept_loss = last_value_per_step(run_dir, "train", lambda e: e["metrics"]["loss"])
    loss = accumulator.Scalars("train/loss")
    assert [event.step for event in loss] == list(range(1, 25))
    # TensorBoard stores float32: each value is the record's, rounded to float32.
    assert [event.value for event in loss] == [float(numpy.float32(kept_loss[step])) for step in range(1, 25)]
    evaluations = last_value_per_step(run_dir, "evaluation", lambda e: e["metrics"]["validation"]["loss"])
    assert [(e.step, e.value) for e in accumulator.Scalars("eval/validation/loss")] == [
        (step, float(numpy.float32(value))) for step, value in sorted(evaluations.items())]

    # In the files: one per attempt, in the order TensorBoard reads them. Stopped attempts' steps never
    # repeat; the killed attempt's lost steps are written again only after the next file's purge marker.
    files = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 4
    steps = []
    purges = []
    for file in files:
        found = list(EventFileLoader(str(file)).Load())
        purges.append(next(e.step for e in found if e.HasField("session_log")))
        steps.append([e.step for e in found if e.HasField("summary") and e.summary.value[0].tag == "train/loss"])
    last_checkpoint, lost_records = kill_facts(interrupted)
    assert steps[0] + steps[1] + steps[3] == list(range(1, 25))
    # The mirror writes each record just after events.jsonl has it: a SIGKILL between the two leaves the
    # killed attempt's file one record short, never a record the run did not log.
    lost_steps = [e["step"] for e in lost_records]
    assert steps[2] == lost_steps[: len(steps[2])] and len(steps[2]) >= len(lost_steps) - 1, (steps[2], lost_steps)
    assert purges[3] == last_checkpoint + 1 <= min(steps[2] or lost_steps)


GOODPUT_PARTS = ("useful_s", "redone_s", "evaluation_s", "checkpoint_s", "startup_s", "queue_s", "between_s", "other_s")


def test_the_goodput_redoes_the_killed_steps_past_the_last_checkpoint_and_its_parts_add_up(interrupted, capsys):
    """Preempted twice (their stops saved `last`: nothing redone), SIGKILLed once: the killed attempt's steps past
    its last checkpoint, which attempt 4 trained again, are its redone steps, and the parts of every window add up
    to the wall time from the submission to the last attempt's end; the killed attempt's window ends at its last
    record, the time until `elfes resume` is between attempts. What status reads (timings.json and the records
    after it) is what the whole records give."""
    import json
    from datetime import datetime

    from elfes.launcher.cli.main import main as elfes
    from elfes.launcher.rundir.goodput_reading import run_timings
    from elfes.records import read_events
    from elfes.records.timings import timings_of_events

    run_dir = interrupted.run_dir
    last_checkpoint, lost = kill_facts(interrupted)
    assert lost and attempt_events(run_dir, 4)[0]["state"]["step"] == last_checkpoint
    redone_steps = interrupted.killed_at_step - last_checkpoint
    assert elfes(["status", str(run_dir), "--json"]) == 0
    goodput = json.loads(capsys.readouterr().out)["goodput"]
    assert [window["number"] for window in goodput["attempts"]] == [1, 2, 3, 4]
    assert [window["redone_steps"] for window in goodput["attempts"]] == [0, 0, redone_steps, 0]
    assert [window["parts"]["redone_s"] > 0 for window in goodput["attempts"]] == [False, False, True, False]
    assert goodput["redone_steps"] == redone_steps

    state = run_state.load_state(RunPaths(run_dir))
    assert [attempt.outcome for attempt in state.attempts] == ["requeued", "requeued", "lost", "finished"]
    wall = (datetime.fromisoformat(state.attempts[-1].ended_at)
            - datetime.fromisoformat(state.submissions[0].at)).total_seconds()
    assert goodput["wall_s"] == pytest.approx(wall, abs=1e-6)
    assert sum(goodput["parts"][name] for name in GOODPUT_PARTS) == pytest.approx(wall, abs=1e-6)
    for window in goodput["attempts"]:
        assert all(window["parts"][name] >= -1e-6 for name in GOODPUT_PARTS), window  # float rounding
    for name in ("useful_s", "evaluation_s", "checkpoint_s", "startup_s", "queue_s"):
        assert goodput["parts"][name] > 0, name
    killed_last = attempt_events(run_dir, 3)[-1]["time"]
    assert datetime.fromisoformat(goodput["attempts"][2]["ends_at"]) == datetime.fromisoformat(killed_last)
    assert goodput["attempts"][3]["parts"]["between_s"] > 0  # from the kill's last record to `elfes resume`
    assert goodput["goodput"] == pytest.approx(goodput["parts"]["useful_s"] / wall)

    assert RunPaths(run_dir).timings.is_file()
    assert run_timings(RunPaths(run_dir)).attempts == timings_of_events(read_events(run_dir)).attempts
    assert elfes(["status", str(run_dir)]) == 0
    shown = capsys.readouterr().out
    assert f"goodput {goodput['goodput']:.1%} of " in shown and f"({redone_steps} steps)" in shown, shown


def test_the_plot_draws_a_time_bar_per_attempt_cut_into_the_goodputs_parts(interrupted, tmp_path, capsys):
    """The last panel: one bar per attempt, its segments the goodput's parts of that attempt's window (as
    `elfes status --json` gives them), the redone part only in the killed attempt's."""
    import json

    from elfes.launcher.cli.main import main as elfes

    run_dir = interrupted.run_dir
    result = plot([run_dir], output=tmp_path / "interrupted.png")
    [time_panel] = [ax for ax in result.figure.get_axes() if ax.get_gid() == "panel:time"]
    segments: dict[str, dict[str, float]] = {}
    for patch in time_panel.patches:
        _, attempt, part = patch.get_gid().split(":")
        segments.setdefault(attempt, {})[part] = patch.get_width()
    assert elfes(["status", str(run_dir), "--json"]) == 0
    windows = json.loads(capsys.readouterr().out)["goodput"]["attempts"]
    assert list(segments) == [str(window["number"]) for window in windows] == ["1", "2", "3", "4"]
    for window in windows:
        drawn = segments[str(window["number"])]
        parts = {name.removesuffix("_s"): value for name, value in window["parts"].items() if value > 0}
        assert drawn.keys() == parts.keys()
        for part, width in drawn.items():  # the plot's goodput is read a moment later than status's
            assert width == pytest.approx(parts[part], rel=1e-6, abs=1e-3), (window["number"], part)
    assert [("redone" in segments[number]) for number in "1234"] == [False, False, True, False]
    assert "goodput" in time_panel.get_xlabel()
