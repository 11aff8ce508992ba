"""The layout of `elfes plot`'s figure, read from its artists: markers at one step each get their own
part of the line, marker labels never cover one another, and the band above the top panel is only as
tall as its rows of labels."""

from __future__ import annotations

import itertools
import math

import pytest

from elfes.records.timeline import build_timeline

pytest.importorskip("matplotlib", reason="the plot extra: pip install -e '.[test]' installs it")

from elfes.plot import RunCurves, draw  # noqa: E402


def run_events(stops: set[int], *, kill_at: int | None = None, total: int = 160) -> list[dict]:
    """A run logging every 5 steps, stopped by SIGUSR2 and resumed at each of ``stops``, killed (and resumed
    10 steps back) at ``kill_at``."""
    events = [{"event": "started", "state": {"step": 0}}]
    for step in range(5, total + 1, 5):
        events.append({"event": "train", "step": step, "metrics": {"loss": 2 * math.exp(-step / 40) + 0.05}})
        if step in stops:
            events += [{"event": "stop_requested", "signal": "SIGUSR2", "reason": "SIGUSR2", "step": step},
                       {"event": "stopped", "reason": "SIGUSR2", "state": {"step": step}},
                       {"event": "resumed", "state": {"step": step}}]
        if step == kill_at:
            events.append({"event": "resumed", "state": {"step": step - 10}})
    return [*events, {"event": "finished", "state": {"step": total}}]


@pytest.fixture
def crowded():
    """Two runs with stops and resumes at the same steps, and stops 5 steps apart."""
    first = RunCurves("quickstart", build_timeline(run_events({20, 25, 60, 65, 70}, kill_at=100)))
    second = RunCurves("other", build_timeline(run_events({20, 60, 62})))
    figure = draw([first, second], ["train/loss", "train/loss"])
    figure.canvas.draw()
    return figure


def test_markers_at_one_step_do_not_overprint(crowded):
    for ax in crowded.get_axes():
        by_step: dict[float, list[tuple[float, float]]] = {}
        for line in ax.get_lines():
            if (line.get_gid() or "").startswith("marker:"):
                low, high = sorted(line.get_ydata())
                by_step.setdefault(line.get_xdata()[0], []).append((low, high))
        assert len(by_step[20]) == 4, "quickstart's and other's stop and resume at step 20"
        for extents in by_step.values():
            extents.sort()
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(extents)), extents
            assert extents[0][0] == 0 and extents[-1][1] == 1, "together they span the panel"


def test_marker_labels_do_not_overlap(crowded):
    renderer = crowded.canvas.get_renderer()
    top = crowded.get_axes()[0]
    labels = [text for text in top.texts if (text.get_gid() or "").startswith("label:")]
    assert len(labels) == 11
    boxes = [text.get_window_extent(renderer) for text in labels]
    for (a, text_a), (b, text_b) in itertools.combinations(zip(boxes, labels), 2):
        assert not a.overlaps(b), f"{text_a.get_text()!r} covers {text_b.get_text()!r}"
    panel_top = top.get_window_extent(renderer).y1
    assert all(box.y0 >= panel_top for box in boxes), "above the panel"


@pytest.mark.parametrize("stops", [set(), {80}, {20, 25, 60, 65, 70}])
def test_the_band_above_the_top_panel_is_as_tall_as_its_rows_of_labels(stops):
    figure = draw([RunCurves("a-run-with-a-long-name", build_timeline(run_events(stops)))], ["train/loss"])
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    (ax,) = figure.get_axes()
    boxes = [text.get_window_extent(renderer) for text in ax.texts]
    rows = {round(box.y0) for box in boxes}
    points = figure.dpi / 72
    line = 1.4 * max(text.get_fontsize() for text in ax.texts) * points  # one line of label text
    title = figure._suptitle.get_window_extent(renderer)
    band = title.y0 - ax.get_window_extent(renderer).y1
    assert band <= len(rows) * (line + 2 * points) + 12 * points, (band, len(rows), line)


def test_a_sweep_of_six_runs_has_a_title_that_fits_and_one_start_label():
    runs = [RunCurves(f"config.lr=0.00{k} config.seed={k}", build_timeline(run_events({40} if k == 2 else set())))
            for k in range(6)]
    figure = draw(runs, ["train/loss"])
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    title = figure._suptitle.get_window_extent(renderer)
    width = figure.get_window_extent(renderer)
    assert width.x0 <= title.x0 and title.x1 <= width.x1, (figure.get_suptitle(), title, width)
    assert figure.get_suptitle() == "6 runs, 7 attempts in all: 1 stop, 1 resume"
    (ax,) = figure.get_axes()
    texts = [text.get_text() for text in ax.texts]
    assert texts.count("6 runs: start") == 1 and not any(text.endswith(": start") and "6 runs" not in text
                                                         for text in texts), texts


@pytest.mark.parametrize(("end", "named"), [
    ({"event": "failed", "exception": "RuntimeError", "state": {"step": 40}}, "lost to a failure, trained again"),
    (None, "lost to a kill, trained again"),
], ids=["failure", "kill"])
def test_the_legend_names_what_lost_the_work_that_was_trained_again(end, named):
    """An attempt that failed (or was killed) at step 40 and a relaunch from step 20: the redone span's legend
    entry says what ended the attempt that lost it."""
    events = [{"event": "started", "state": {"step": 0}}]
    events += [{"event": "train", "step": step, "metrics": {"loss": 1.0 / step}} for step in range(5, 41, 5)]
    events += [end] if end else []
    events += [{"event": "resumed", "state": {"step": 20}}]
    events += [{"event": "train", "step": step, "metrics": {"loss": 1.0 / step}} for step in range(25, 61, 5)]
    events += [{"event": "finished", "state": {"step": 60}}]
    figure = draw([RunCurves("run", build_timeline(events))], ["train/loss"])
    legend = [text.get_text() for text in figure.get_axes()[0].get_legend().get_texts()]
    assert [text for text in legend if text.startswith("lost to")] == [named], legend


def test_a_resume_on_another_world_size_is_marked_with_its_ranks():
    events = [
        {"event": "started", "world_size": 2, "state": {"step": 0}},
        {"event": "train", "step": 4, "metrics": {"loss": 1.0}},
        {"event": "stopped", "step": 4, "reason": "SIGTERM", "state": {"step": 4}},
        {"event": "resumed", "world_size": 1, "state": {"step": 4}},
        {"event": "train", "step": 8, "metrics": {"loss": 0.5}},
        {"event": "stopped", "step": 8, "reason": "SIGTERM", "state": {"step": 8}},
        {"event": "resumed", "world_size": 1, "state": {"step": 8}},
        {"event": "train", "step": 12, "metrics": {"loss": 0.25}},
    ]
    starts = [marker.label for marker in build_timeline(events).markers if marker.kind in ("start", "resume")]
    assert starts == ["start", "resume on 1 rank", "resume"]


def test_a_preemption_counts_once_in_the_title_and_a_resume_on_other_ranks_names_them():
    """Two preemptions (a SIGUSR2 stop, then the run's requeue: one interruption each), a SIGTERM stop resumed by
    hand on 1 rank instead of 2: the title counts 2 requeues, 1 stop and 1 resume, and the resume's label says
    the ranks it continued on, as the guide promises."""
    events = run_events({20, 40, 60})
    for event in events:
        if event["event"] in ("started", "resumed"):
            event["world_size"] = 2
    last_resume = [index for index, event in enumerate(events) if event["event"] == "resumed"][-1]
    events[last_resume]["world_size"] = 1
    timeline = build_timeline(events, launches=["submit", "requeue", "requeue", "resume"])
    figure = draw([RunCurves("run", timeline)], ["train/loss"])
    assert figure.get_suptitle() == "run: 4 attempts: 1 stop, 2 requeues, 1 resume"
    (ax,) = figure.get_axes()
    labels = {text.get_position()[0]: text.get_text() for text in ax.texts}
    assert labels[20] == "SIGUSR2 / requeue" and labels[60] == "SIGUSR2 / resume on 1 rank", labels
