"""The rich console: a progress bar on a terminal, plain lines elsewhere. The only room that imports rich."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from elfes.contract import END_EVENTS, START_EVENTS, EventKind

from .plain import PlainLines, format_number, format_rate


class ConsoleDisplay:
    """Show a run's events on a rich console. Main process only; :class:`~elfes.records.RunLogger` owns one.

    On an interactive terminal every event prints a line above a progress bar (train events at the log
    interval, paths relative to ``run_dir`` or the working folder) and moves the bar, which is redrawn at
    once; otherwise (SLURM log files, CI) each event becomes one timestamped plain line without escape
    codes, its paths in full.

    Example:
        >>> display = ConsoleDisplay(Console(), run_dir=Path("runs/a"))  # doctest: +SKIP
        >>> display.show({"event": "export", "weights": "ema", "path": "runs/a/model.pt"}, now)  # doctest: +SKIP
        >>> display.close()  # doctest: +SKIP
    """

    def __init__(self, console: Console | None = None, *, run_dir: str | os.PathLike[str] | None = None) -> None:
        self.console = console if console is not None else Console(stderr=False)
        self.run_dir = None if run_dir is None else Path(os.path.abspath(run_dir))
        self._lines = PlainLines()
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def show(self, event: Mapping[str, Any], now: datetime) -> None:
        """Print or draw one validated event."""
        if not self.console.is_terminal:
            self.console.out(self._lines.line(now, event), highlight=False)
            return
        name = event["event"]
        line = self._lines.line(now, self._with_short_paths(event))
        if name in START_EVENTS:
            self._start_bar(event)
        self._move_bar(event)
        if name in END_EVENTS:  # the run no longer trains in this process: the bar stops where they say
            self.close()
        self.console.out(line, highlight=False)  # above the bar, which is redrawn below it

    def close(self) -> None:
        """Stop the progress bar, leaving its last state on screen; idempotent."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None

    def short_path(self, path: Any) -> str:
        """``path`` relative to the run directory, else to the working folder, when under it; else in full."""
        absolute = Path(os.path.abspath(path))
        for base in (self.run_dir, Path.cwd()):
            if base is not None and absolute.is_relative_to(base) and absolute != base:
                return str(absolute.relative_to(base))
        return str(path)

    def _with_short_paths(self, event: Mapping[str, Any]) -> Mapping[str, Any]:
        fields = [name for name in ("path", "resumed_from") if isinstance(event.get(name), (str, os.PathLike))]
        if not fields:
            return event
        return {**event, **{name: self.short_path(event[name]) for name in fields}}

    def _start_bar(self, event: Mapping[str, Any]) -> None:
        self.close()
        # Redrawn on each event (never from a timer), so the bar shows what the line above it says.
        self._progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[metrics]}"),
            TimeRemainingColumn(),
            console=self.console,
            auto_refresh=False,
        )
        # Start at the current step so a resume does not count as instant progress in the ETA.
        self._task = self._progress.add_task(
            "train",
            total=event["budget"]["planned_steps"],
            completed=event["state"]["step"],
            epoch=self._lines.epoch_label(event),
            metrics="",  # until the first train event: no loss or speed yet
        )
        self._progress.start()
        self._progress.refresh()

    def _move_bar(self, event: Mapping[str, Any]) -> None:
        """Put the bar at the event's step: every event that carries one, so that it ends where the run did."""
        if self._progress is None or self._task is None:
            return
        name = event["event"]
        state = event.get("state")
        step = event["step"] if "step" in event else state["step"] if isinstance(state, Mapping) else None
        if step is None:
            return
        fields: dict[str, Any] = {"completed": step, "epoch": self._lines.epoch_label(event)}
        if name == EventKind.TRAIN:
            metrics = event["metrics"]
            fields.update(
                total=event["planned_steps"],
                metrics=f"loss {format_number(metrics.get('loss'))} "
                f"{format_rate(metrics.get('samples_per_second'))} samples/s",
            )
        elif name == EventKind.FINISHED:
            # A finished run is complete, also when it ended early on the monitor or was already past its budget.
            fields["total"] = step
        self._progress.update(self._task, **fields)
        self._progress.refresh()
