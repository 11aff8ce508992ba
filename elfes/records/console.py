"""The rich console: a progress bar on a terminal, plain lines elsewhere. The only room that imports rich."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from .plain import PlainLines, format_number, format_rate


class ConsoleDisplay:
    """Show a run's events on a rich console. Main process only; :class:`~elfes.records.RunLogger` owns one.

    On an interactive terminal the train events drive a progress bar and every other event prints a
    line above it; otherwise (SLURM log files, CI) each event becomes one timestamped plain line
    without escape codes.

    Example:
        >>> display = ConsoleDisplay(Console())  # doctest: +SKIP
        >>> display.show({"event": "export", "weights": "ema", "path": "m.pt"}, now)  # doctest: +SKIP
        >>> display.close()  # doctest: +SKIP
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console if console is not None else Console(stderr=False)
        self._lines = PlainLines()
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def show(self, event: Mapping[str, Any], now: datetime) -> None:
        """Print or draw one validated event."""
        name = event["event"]
        line = self._lines.line(now, event)
        if not self.console.is_terminal:
            self.console.out(line, highlight=False)
            return
        if name in ("started", "resumed"):
            self._start_bar(event)
        self._move_bar(event)
        if name in _RUN_ENDS:
            self.close()
        if name != "train":
            self.console.out(line, highlight=False)

    def close(self) -> None:
        """Stop the progress bar, leaving its last state on screen; idempotent."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None

    def _start_bar(self, event: Mapping[str, Any]) -> None:
        self.close()
        self._progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[speed]} samples/s"),
            TimeRemainingColumn(),
            console=self.console,
        )
        # Start at the current step so a resume does not count as instant progress in the ETA.
        self._task = self._progress.add_task(
            "train",
            total=event["budget"]["planned_steps"],
            completed=event["state"]["step"],
            epoch=self._lines.epoch_label(event),
            loss="n/a",
            speed="n/a",
        )
        self._progress.start()

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
        if name == "train":
            metrics = event["metrics"]
            fields.update(
                total=event["planned_steps"],
                loss=format_number(metrics.get("loss")),
                speed=format_rate(metrics.get("samples_per_second")),
            )
        elif name == "finished":
            # A finished run is complete, also when it ended early on the monitor or was already past its budget.
            fields["total"] = step
        self._progress.update(self._task, **fields)


# Events after which the run no longer trains in this process: the bar stops where they say.
_RUN_ENDS = ("finished", "stopped", "failed")
