"""Drawing for ``elfes plot``: each metric against the optimizer step, every interruption marked.

The only module of ELFES that imports matplotlib (the non-interactive Agg canvas, no pyplot and no
global backend change); :mod:`elfes.records.timeline` computes what it draws, torch-free and
matplotlib-free. Install matplotlib with ``pip install 'elfes[plot]'``.

What a figure holds, one panel per metric (gid ``panel:<metric>``) with the step axis shared; its y
label is the metric, with `` (log)`` where positive values spanning more than a factor 20 get a log
axis. Tests read the data back by gid:

- the kept path of each run, one line per run and panel, labelled by the run's name (gid ``kept:<run>``),
  each run in its own colour; beyond eight runs the colours follow a colour map over the runs' order and the
  legend names the first and the last run;
- each segment lost to a kill or crash, as a faded wide stroke (gid ``lost:<attempt>:<run>``): after an
  exact resume the redo retraces it, so the stroke shows around the kept line where work was redone; the
  legend names what lost it (``lost to a kill``, ``lost to a failure``, or both);
- the step range of that lost work, shaded (gid ``lostspan:<attempt>:<run>``);
- a vertical line per marker at its step (gid ``marker:<kind>:<attempt>:<run>``, kind: start, resume,
  requeue, stop, killed, failed); markers at one step share its height, each over its own part;
- a label per run and step naming its markers (``SIGTERM / requeue``, ``kill``; gid ``label:<run>``),
  above the top panel in as many rows as it takes for no label to cover another; a label that three or
  more runs share at one step is drawn once (``6 runs: start``; gid ``label:<n> runs``);
- a title naming each run's interruptions, or for many runs (a sweep) their sum;
- for one run with a goodput (``RunCurves.goodput``), a last panel (gid ``panel:time``) with a horizontal bar
  per attempt: its window of the run's wall time split into the goodput's parts (useful training, redone,
  evaluation, checkpoint stalls, start-up, queue, between attempts, other), each segment gid
  ``timebar:<attempt>:<part>`` (``after`` for the wait after the last attempt).

Example:
    >>> figure = draw([RunCurves("quickstart", build_timeline(read_events(run_dir)))], ["train/loss"])  # doctest: +SKIP
    >>> save(figure, Path("plot.png"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from elfes.records.goodput import PART_LABELS, Goodput
from elfes.records.timeline import Marker, Timeline

try:
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.text import Text
    from matplotlib.ticker import MaxNLocator
    from matplotlib.transforms import offset_copy
except ImportError as error:
    raise ImportError(
        "elfes plot draws with matplotlib, which is not installed; install it with: "
        "pip install 'elfes[plot]' (or pip install matplotlib)"
    ) from error

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.typing import ColorType, LineStyleType  # matplotlib 3.8 and newer

FORMATS = (".png", ".svg")
RUN_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
MANY_RUNS_COLORMAP = "viridis"  # for more runs than RUN_COLORS: the first run dark blue, the last yellow
# Marker kind -> (colour, line style, legend text).
MARKER_STYLES: dict[str, tuple[str, LineStyleType, str]] = {
    "start": ("dimgray", ":", "start"),
    "requeue": ("seagreen", ":", "requeue (relaunched by itself)"),
    "resume": ("royalblue", ":", "resume"),
    "stop": ("darkorange", "--", "stop (signal named)"),
    "killed": ("crimson", "-.", "killed (no stop recorded)"),
    "failed": ("crimson", "-.", "failed"),
}
LOST_ALPHA = 0.35
LABEL_FONT_SIZE = 7
LABEL_GAP_PT = 2.0  # between the panel and the first row of marker labels, and between rows
LABEL_SPACING_PT = 8.0  # between two labels in a row
PANEL_HEIGHT_IN = 2.3
TITLE_CHARS = 110  # about what one line of the title holds at its font size across the figure's 9 inches
MERGE_RUNS = 3  # a marker label that this many runs share at one step is drawn once
# A panel whose values are all positive and span more than this factor (a loss falling from 4 to 0.05)
# gets a log axis, its label saying so ("train/loss (log)").
LOG_SCALE_RATIO = 20.0


@dataclass(frozen=True)
class RunCurves:
    """One run to draw: its legend ``name`` and its :class:`~elfes.records.timeline.Timeline`."""

    name: str
    timeline: Timeline
    goodput: Goodput | None = None  # where its wall time went, drawn as a bar per attempt (one run only)


# Each part of the wall time in the time bars, in the order they come within an attempt's window (the wait for
# it, its start, its work, the rest): useful work in green, lost work in red, waiting in greys.
BAR_ORDER = ("between_s", "queue_s", "startup_s", "useful_s", "redone_s", "evaluation_s", "checkpoint_s", "other_s")
PART_COLORS = {"useful_s": "#2ca02c", "redone_s": "#d62728", "evaluation_s": "#1f77b4", "checkpoint_s": "#9467bd",
               "startup_s": "#ff7f0e", "queue_s": "#7f7f7f", "between_s": "#c7c7c7", "other_s": "#bcbd22"}


def draw(runs: Sequence[RunCurves], metrics: Sequence[str], *, title: str | None = None) -> Figure:
    """A figure with one panel per metric (names as in :func:`~elfes.records.timeline.select_metrics`).

    A run without a metric simply has no line in that panel. Returns the figure; :func:`save` writes it.
    """
    if not runs or not metrics:
        raise ValueError("draw needs at least one run and one metric; give run directories and metric names")
    goodput = runs[0].goodput if len(runs) == 1 and runs[0].goodput is not None and runs[0].goodput.attempts else None
    bars = [] if goodput is None else [0.9 + 0.3 * len(goodput.attempts)]
    figure = Figure(figsize=(9.0, 1.2 + PANEL_HEIGHT_IN * len(metrics) + sum(bars)), layout="constrained")
    canvas = FigureCanvasAgg(figure)
    grid = figure.add_gridspec(len(metrics) + len(bars), 1, height_ratios=[PANEL_HEIGHT_IN] * len(metrics) + bars)
    axes = [figure.add_subplot(grid[0])]
    axes += [figure.add_subplot(grid[index], sharex=axes[0]) for index in range(1, len(metrics))]
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    colors = run_colors(len(runs))
    for ax, metric in zip(axes, metrics):
        for run, color in zip(runs, colors):
            _draw_series(ax, run, metric, color)
        _draw_markers(ax, runs)
        log = _wants_log_scale(runs, metric)
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(f"{metric} (log)" if log else metric)
        ax.set_gid(f"panel:{metric}")
        ax.grid(True, alpha=0.25)
    labels = _label_markers(axes[0], runs)
    axes[-1].set_xlabel("optimizer step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].legend(handles=_legend_handles(runs, colors), loc="upper right", fontsize=8, framealpha=0.85)
    figure.suptitle(title or _title(runs), fontsize=10)
    _stack_labels(canvas, axes[0], labels)
    if goodput is not None:
        _draw_time_bars(figure.add_subplot(grid[len(metrics)]), goodput)
    return figure


def _draw_time_bars(ax: Axes, goodput: Goodput) -> None:
    """A horizontal bar per attempt of the run's wall time (and one for the wait after the last, if any), each
    cut into the goodput's parts, in seconds."""
    drawn: set[str] = set()
    rows = []
    for row, window in enumerate(goodput.attempts):
        rows.append(f"attempt {window.number}" if window.number is not None else "after")
        left = 0.0
        for part in BAR_ORDER:
            label, width = PART_LABELS[part], float(getattr(window.parts, part))
            if width <= 0:
                continue
            [bar] = ax.barh(row, width, left=left, height=0.6, color=PART_COLORS[part],
                            label=label if part not in drawn else "_nolegend_")
            bar.set_gid(f"timebar:{window.number if window.number is not None else 'after'}:{part.removesuffix('_s')}")
            drawn.add(part)
            left += width
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    share = goodput.goodput
    ax.set_xlabel("seconds of the run's wall time" + (f" (goodput {share:.1%})" if share is not None else ""))
    ax.set_gid("panel:time")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), fontsize=7, ncols=8, frameon=False)
    ax.grid(True, axis="x", alpha=0.25)


def _title(runs: Sequence[RunCurves]) -> str:
    """Each run's interruptions while that fits one line of the figure; else (a sweep of many members) the
    runs counted together, so that the title is never cut at the figure's edges."""
    each = "; ".join(f"{run.name}: {describe(run.timeline)}" for run in runs)
    if len(runs) == 1 or len(each) <= TITLE_CHARS:
        return each
    counts: dict[str, int] = {}
    for run in runs:
        for kind, count in _interruptions(run.timeline).items():
            counts[kind] = counts.get(kind, 0) + count
    attempts = sum(len(run.timeline.attempts) for run in runs)
    return f"{len(runs)} runs, {attempts} attempts in all" + (f": {_counted(counts)}" if counts else "")


def describe(timeline: Timeline) -> str:
    """The interruptions of a run in a few words, for the title: a stop that the run's requeue followed (a
    preemption, a time limit) counts once, as a requeue.

    Example:
        >>> describe(build_timeline(read_events(run_dir)))  # doctest: +SKIP
        '4 attempts: 2 requeues, 1 kill, 1 resume'
    """
    counts = _interruptions(timeline)
    attempts = len(timeline.attempts)
    return f"{attempts} attempt{'s' if attempts > 1 else ''}" + (f": {_counted(counts)}" if counts else "")


_TITLE_WORDS = {"stop": "stop", "requeue": "requeue", "killed": "kill", "failed": "failure", "resume": "resume"}


def _interruptions(timeline: Timeline) -> dict[str, int]:
    """Each kind of marker of ``timeline`` (but its start) counted, a stop that a requeue relaunched left out."""
    requeued = {attempt.number - 1 for attempt in timeline.attempts if attempt.launch == "requeue"}
    counts: dict[str, int] = {}
    for marker in timeline.markers:
        if marker.kind in _TITLE_WORDS and not (marker.kind == "stop" and marker.attempt in requeued):
            counts[marker.kind] = counts.get(marker.kind, 0) + 1
    return counts


def _counted(counts: dict[str, int]) -> str:
    """``2 requeues, 1 kill``, in the order of _TITLE_WORDS."""
    return ", ".join(f"{counts[kind]} {word}{'s' if counts[kind] > 1 else ''}" for kind, word in _TITLE_WORDS.items()
                     if kind in counts)


def save(figure: Figure, path: Path) -> Path:
    """Write ``figure`` to ``path`` (``.png`` or ``.svg``, creating its folder); returns the path."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"cannot write a plot to {path}: use a file name ending in {' or '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def _draw_series(ax: Axes, run: RunCurves, metric: str, color: ColorType) -> None:
    series = run.timeline.series.get(metric)
    if series is None:
        return
    dots = "o" if len(series.kept_steps) <= 60 else None
    ax.plot(series.kept_steps, series.kept_values, color=color, linewidth=1.6, marker=dots, markersize=2.5,
            gid=f"kept:{run.name}", label=run.name, zorder=3)
    for segment in series.lost:
        ax.plot([point.step for point in segment], [point.value for point in segment], color=color,
                alpha=LOST_ALPHA, linewidth=6, solid_capstyle="round", marker="o", markersize=7,
                gid=f"lost:{segment[0].attempt}:{run.name}", label="_lost", zorder=2)


def _wants_log_scale(runs: Sequence[RunCurves], metric: str) -> bool:
    """A log axis for a metric whose values are all positive and span more than LOG_SCALE_RATIO."""
    values = [value for run in runs if (series := run.timeline.series.get(metric)) is not None
              for value in (*series.kept_values, *(point.value for segment in series.lost for point in segment))]
    return bool(values) and min(values) > 0 and max(values) / min(values) > LOG_SCALE_RATIO


def _draw_markers(ax: Axes, runs: Sequence[RunCurves]) -> None:
    """Lost spans shaded; a vertical line per marker. Markers at one step (of any run) share the height,
    each drawn over its own part of it, so that none hides another."""
    at_step: dict[int, list[tuple[RunCurves, Marker]]] = {}
    for run in runs:
        for span in run.timeline.lost_spans:
            ax.axvspan(span.after_step, span.last_step, color=MARKER_STYLES["killed"][0], alpha=0.07, linewidth=0,
                       gid=f"lostspan:{span.attempt}:{run.name}", label="_lostspan")
        for marker in run.timeline.markers:
            at_step.setdefault(marker.step, []).append((run, marker))
    for step, found in at_step.items():
        share = 1.0 / len(found)
        for index, (run, marker) in enumerate(found):
            color, style, _ = MARKER_STYLES[marker.kind]
            ax.axvline(step, ymin=index * share, ymax=(index + 1) * share, color=color, linestyle=style,
                       linewidth=1.0, alpha=0.8, gid=f"marker:{marker.kind}:{marker.attempt}:{run.name}",
                       label="_marker")


def _label_markers(ax: Axes, runs: Sequence[RunCurves]) -> list[Text]:
    """One label per run and step above the top panel, naming every marker there (``SIGUSR2 / requeue``),
    prefixed with the run's name when there are several runs. A label that MERGE_RUNS or more runs share at
    one step (every member's ``start`` at step 0 in a sweep) is drawn once, naming how many runs share it."""
    several = len(runs) > 1
    by_step: dict[tuple[int, str], list[str]] = {}
    for run in runs:
        labels: dict[int, list[str]] = {}
        for marker in run.timeline.markers:
            labels.setdefault(marker.step, [])
            if _short_label(run, marker) not in labels[marker.step]:
                labels[marker.step].append(_short_label(run, marker))
        for step, names in labels.items():
            by_step.setdefault((step, " / ".join(names)), []).append(run.name)
    texts = []
    for (step, text), names in by_step.items():
        if len(names) >= MERGE_RUNS:
            shown, gid = f"{len(names)} runs: {text}", f"label:{len(names)} runs"
            texts.append(_label(ax, step, shown, gid))
            continue
        for name in names:
            texts.append(_label(ax, step, f"{name}: {text}" if several else text, f"label:{name}"))
    return texts


def _label(ax: Axes, step: int, text: str, gid: str) -> Text:
    return ax.text(step, 1.0, text, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                   fontsize=LABEL_FONT_SIZE, clip_on=False, gid=gid)


def _stack_labels(canvas: FigureCanvasAgg, ax: Axes, texts: Sequence[Text]) -> None:
    """Put each label in the lowest row above the panel where it overlaps no other, so that the band
    above the panel is as tall as its rows and no label covers another. Measured on the laid-out figure
    (rows change the panel's height, never its width, so the steps stay where they were measured)."""
    if not texts:
        return
    figure = canvas.figure
    figure.draw_without_rendering()  # lays the figure out and sizes its texts; only save() rasterizes it
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]  # matplotlib leaves it unannotated
    spacing_px = LABEL_SPACING_PT * figure.dpi / 72
    row_ends: list[float] = []  # the right edge of the last label of each row, in pixels
    for text in sorted(texts, key=lambda text: text.get_window_extent(renderer).x0):
        box = text.get_window_extent(renderer)
        row = next((index for index, end in enumerate(row_ends) if end + spacing_px <= box.x0), len(row_ends))
        if row == len(row_ends):
            row_ends.append(box.x1)
        row_ends[row] = box.x1
        lift_pt = LABEL_GAP_PT + row * (box.height * 72 / figure.dpi + LABEL_GAP_PT)
        text.set_transform(offset_copy(ax.get_xaxis_transform(), fig=figure, y=lift_pt, units="points"))


def _short_label(run: RunCurves, marker: Marker) -> str:
    """A stop is named by its signal (a cancel ``cancel``), a kill ``kill``, a failure by its exception; the line
    style says the rest."""
    attempt = run.timeline.attempts[marker.attempt - 1]
    if marker.kind == "stop":
        return "cancel" if attempt.cancelled else str(attempt.stop_signal)
    if marker.kind == "failed":
        return str(attempt.failure)
    if marker.kind in ("resume", "requeue"):
        return marker.label  # ``resume on 2 ranks`` where the attempt continued on another world size
    return "kill" if marker.kind == "killed" else marker.kind


def run_colors(count: int) -> list[ColorType]:
    """A colour per run: the distinct RUN_COLORS while they last; for more runs (a sweep) a sequential colour map
    over the runs' order, since a legend of every member would cover the panel and repeated colours would lie."""
    if count <= len(RUN_COLORS):
        return list(RUN_COLORS[:count])
    return [colormaps[MANY_RUNS_COLORMAP](index / (count - 1)) for index in range(count)]


LOST_CAUSES = {"killed": "a kill", "failed": "a failure"}  # how an attempt that lost work ended


def _lost_causes(runs: Sequence[RunCurves]) -> list[str]:
    """What ended the attempts whose work was trained again, in the order of LOST_CAUSES (``a kill``, ``a
    failure``); any other end (a stop whose `last` lagged) is ``an interruption``."""
    ends = {run.timeline.attempts[segment[0].attempt - 1].end for run in runs
            for series in run.timeline.series.values() for segment in series.lost if segment}
    named = [cause for end, cause in LOST_CAUSES.items() if end in ends]
    return named + (["an interruption"] if ends - set(LOST_CAUSES) else [])


def _legend_handles(runs: Sequence[RunCurves], colors: Sequence[ColorType]) -> list[Line2D]:
    if len(runs) <= len(RUN_COLORS):
        handles = [Line2D([], [], color=color, linewidth=1.6, label=run.name) for run, color in zip(runs, colors)]
    else:  # the first and the last run name the ends of the colour map
        handles = [Line2D([], [], color=colors[0], linewidth=1.6, label=f"{runs[0].name} (first of {len(runs)})"),
                   Line2D([], [], color=colors[-1], linewidth=1.6, label=f"{runs[-1].name} (last)")]
    causes = _lost_causes(runs)
    if causes:
        handles.append(Line2D([], [], color="gray", alpha=LOST_ALPHA, linewidth=6, solid_capstyle="round",
                              label=f"lost to {' or '.join(causes)}, trained again"))
    kinds = dict.fromkeys(marker.kind for run in runs for marker in run.timeline.markers)
    for kind in MARKER_STYLES:
        if kind in kinds:
            color, style, text = MARKER_STYLES[kind]
            handles.append(Line2D([], [], color=color, linestyle=style, linewidth=1.0, label=text))
    return handles
